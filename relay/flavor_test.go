package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"

	"github.com/shardfs/shardfs/core"
)

// A client without MESSAGE_CONTENT gets messages as Discord sends them to
// such an app: content, embeds, attachments and components empty and no
// poll, except in a DM, in a message the bot wrote and in one that
// mentions it; a client with the intent gets them whole.
func TestMessageContentIntent(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	l := r.shards[0]
	l.ready(1)
	without := r.dial("")
	without.ready(0, 1, 1, intentGuilds|intentGuildMessages|intentDirectMessages)
	with := r.dial("")
	with.ready(0, 1, 1, intentGuilds|intentGuildMessages|intentDirectMessages|intentMessageContent)
	full := `"content":"secret","embeds":[{"title":"e"}],"attachments":[{"id":"9"}],"components":[{"type":1}],"poll":{"question":{"text":"q"}}`
	g := guildID(0)
	l.dispatch("MESSAGE_CREATE", `{"id":"1","channel_id":"7","guild_id":"`+g+`",`+full+`,"author":{"id":"5"},"mentions":[]}`)
	l.dispatch("MESSAGE_CREATE", `{"id":"2","channel_id":"8",`+full+`,"author":{"id":"5"},"mentions":[]}`)
	l.dispatch("MESSAGE_CREATE", `{"id":"3","channel_id":"7","guild_id":"`+g+`",`+full+`,"author":{"id":"5"},"mentions":[{"id":"`+botID+`"}]}`)
	l.dispatch("MESSAGE_CREATE", `{"id":"4","channel_id":"7","guild_id":"`+g+`",`+full+`,"author":{"id":"`+botID+`"},"mentions":[]}`)
	l.dispatch("MESSAGE_UPDATE", `{"id":"1","channel_id":"7","guild_id":"`+g+`",`+full+`,"author":{"id":"5"}}`)
	l.dispatch("MESSAGE_UPDATE", `{"id":"1","channel_id":"7","guild_id":"`+g+`","pinned":true}`)
	for _, tc := range []struct {
		what  string
		blank bool
	}{
		{"a guild message", true},
		{"a DM", false},
		{"a message that mentions the bot", false},
		{"the bot's own message", false},
		{"a guild message's edit", true},
	} {
		for _, c := range []*client{without, with} {
			f := c.next()
			var m map[string]json.RawMessage
			if err := json.Unmarshal(f.D, &m); err != nil {
				t.Fatal(err)
			}
			blank := c == without && tc.blank
			got := fmt.Sprintf("%s %s %s %s poll=%v", m["content"], m["embeds"], m["attachments"], m["components"], m["poll"] != nil)
			want := `"secret" [{"title":"e"}] [{"id":"9"}] [{"type":1}] poll=true`
			if blank {
				want = `"" [] [] [] poll=false`
			}
			if got != want {
				t.Errorf("%s to the client with intents %s: %s; want %s", tc.what, map[bool]string{true: "without MESSAGE_CONTENT", false: "with it"}[c == without], got, want)
			}
			if string(m["id"]) == "" || string(m["author"]) == "" {
				t.Errorf("%s lost its other fields: %s", tc.what, f.D)
			}
		}
	}
	// An edit without content fields is passed as it is.
	if f := without.next(); f.T != "MESSAGE_UPDATE" || !strings.Contains(string(f.D), `"pinned":true`) || strings.Contains(string(f.D), `"content"`) {
		t.Errorf("an edit of other fields: %s %s; want it unchanged", f.T, f.D)
	}
}

// fluxerClient is a Fluxer v1 client of the relay, with the zstd stream
// in both directions when compressed.
type fluxerClient struct {
	*client
	enc *zstd.Encoder // nil: plain
	out bytes.Buffer
	in  *io.PipeWriter
	dec *zstd.Decoder
	js  *json.Decoder
	end chan error // the reader's last error
}

func (r *rig) dialFluxer(query string, compressed bool) *fluxerClient {
	r.t.Helper()
	if compressed {
		query += "&compress=zstd-stream&stream=1"
	}
	ws, _, err := websocket.DefaultDialer.Dial(r.url+"/?"+query, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { ws.Close() })
	c := &fluxerClient{client: &client{t: r.t, ws: ws}}
	if compressed {
		c.enc, _ = zstd.NewWriter(&c.out, zstd.WithEncoderConcurrency(1))
		pr, pw := io.Pipe()
		c.in = pw
		c.end = make(chan error, 1)
		c.dec, _ = zstd.NewReader(pr, zstd.WithDecoderConcurrency(1))
		c.js = json.NewDecoder(c.dec)
		r.t.Cleanup(func() { pw.Close(); c.dec.Close(); c.enc.Close() })
		go func() {
			for {
				ws.SetReadDeadline(time.Now().Add(time.Minute)) // a hang's bound
				typ, msg, err := ws.ReadMessage()
				if err != nil {
					c.end <- err
					pw.CloseWithError(err)
					return
				}
				if typ != websocket.BinaryMessage {
					pw.CloseWithError(fmt.Errorf("message of type %d in a zstd stream", typ))
					return
				}
				pw.Write(msg)
			}
		}()
	}
	return c
}

func (c *fluxerClient) send(v string) {
	c.t.Helper()
	if c.enc == nil {
		c.client.send(v)
		return
	}
	c.out.Reset()
	c.enc.Write([]byte(v))
	c.enc.Flush()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, c.out.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

// closed waits for the connection's close and returns its code.
func (c *fluxerClient) closed() int {
	c.t.Helper()
	if c.enc == nil {
		return c.client.closed()
	}
	var ce *websocket.CloseError
	if err := <-c.end; !errors.As(err, &ce) {
		c.t.Fatalf("read: %v; want a close frame", err)
	}
	return ce.Code
}

func (c *fluxerClient) next() frame {
	c.t.Helper()
	if c.enc == nil {
		return c.client.next()
	}
	var f frame
	if err := c.js.Decode(&f); err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

// In front of a Fluxer node the relay speaks Fluxer v1: v=1 only (else
// 4012 before Hello), no intents (an identify without them is served
// everything), no resume_gateway_url, zstd-stream with stream=1 in both
// directions, a heartbeat past the last sequence closes 4007, and
// discovery under a /v1 base gives Fluxer's constant limits.
func TestFluxerFlavor(t *testing.T) {
	r := newRig(t, 2, []int{0, 1}, func(c *Config) { c.Flavor = core.Fluxer; c.Intents = 0 })
	l := r.shards[1]
	l.ready(2)

	v10 := r.dialFluxer("v=10&encoding=json", false)
	if got := v10.closed(); got != 4012 {
		t.Errorf("v=10 on Fluxer: close %d; want 4012", got)
	}

	for _, compressed := range []bool{false, true} {
		c := r.dialFluxer("v=1&encoding=json", compressed)
		if f := c.next(); f.Op != 10 {
			t.Fatalf("compressed %v: first frame op %d; want Hello", compressed, f.Op)
		}
		c.send(`{"op":2,"d":{"token":"` + testToken + `","shard":[1,2],"properties":{"os":"linux","browser":"t","device":"t"}}}`)
		f := c.next()
		var ready map[string]json.RawMessage
		json.Unmarshal(f.D, &ready)
		if f.T != "READY" || ready["resume_gateway_url"] != nil || string(ready["shard"]) != "[1,2]" || ready["session_id"] == nil {
			t.Fatalf("compressed %v: %s %s; want READY for [1,2] with a session id and no resume_gateway_url", compressed, f.T, f.D)
		}
		for range 2 {
			if f := c.next(); f.T != "GUILD_CREATE" {
				t.Fatalf("compressed %v: %s; want GUILD_CREATE", compressed, f.T)
			}
		}
		n := int(l.seq)
		l.message(0, n)
		l.dispatch("PRESENCE_UPDATE", `{"guild_id":"`+guildID(0)+`","user":{"id":"5"},"status":"online"}`)
		if f := c.next(); f.T != "MESSAGE_CREATE" || *f.S != 4 || !strings.Contains(string(f.D), fmt.Sprintf(`"m%d"`, n)) {
			t.Fatalf("compressed %v: %s s=%v %s; want MESSAGE_CREATE s=4", compressed, f.T, f.S, f.D)
		}
		if f := c.next(); f.T != "PRESENCE_UPDATE" {
			t.Fatalf("compressed %v: %s; want PRESENCE_UPDATE (Fluxer has no intents to filter it)", compressed, f.T)
		}
		c.send(`{"op":3,"d":{"status":"online","since":null,"activities":[],"afk":false}}`)
		c.send(`{"op":1,"d":5}`)
		if f := c.next(); f.Op != 11 {
			t.Fatalf("compressed %v: heartbeat answered with op %d; want 11", compressed, f.Op)
		}
		c.send(`{"op":1,"d":6}`)
		if got := c.closed(); got != 4007 {
			t.Errorf("compressed %v: heartbeat past the last sequence: close %d; want 4007", compressed, got)
		}
	}
	if s := r.sends(); len(s) != 2 || !strings.Contains(s[1].payload, `"op":3`) || s[1].shard != 1 {
		t.Errorf("upstream got %v; want the two presence updates on shard 1", s)
	}

	resp, err := http.Get(strings.Replace(r.url, "ws://", "http://", 1) + "/v1/gateway/bot")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		URL    string
		Shards int
		Limit  struct {
			MaxConcurrency int `json:"max_concurrency"`
		} `json:"session_start_limit"`
	}
	json.NewDecoder(resp.Body).Decode(&d)
	if resp.StatusCode != 401 {
		t.Errorf("discovery without a token: %d; want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", strings.Replace(r.url, "ws://", "http://", 1)+"/v1/gateway/bot", nil)
	req.Header.Set("Authorization", "Bot "+testToken)
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	json.NewDecoder(resp2.Body).Decode(&d)
	if d.URL != r.url || d.Shards != 2 || d.Limit.MaxConcurrency != 1 {
		t.Errorf("discovery = %+v; want the relay's URL, the plan's 2 shards, Fluxer's max_concurrency 1", d)
	}
}

// On Fluxer the relay asks for a heartbeat with op 1 at 90% of the
// interval, as Fluxer does, and a heartbeat puts the next ask off.
func TestFluxerAsksForHeartbeat(t *testing.T) {
	r := newRig(t, 1, []int{0}, func(c *Config) { c.Flavor = core.Fluxer; c.Intents = 0 })
	c := r.dialFluxer("v=1", false)
	if f := c.next(); f.Op != 10 {
		t.Fatalf("first frame op %d; want Hello", f.Op)
	}
	for range 2 {
		r.clk.Advance(fluxerAsk)
		if f := c.next(); f.Op != 1 {
			t.Fatalf("after %v: op %d; want a heartbeat request (op 1)", fluxerAsk, f.Op)
		}
		c.send(`{"op":1,"d":null}`)
		if f := c.next(); f.Op != 11 {
			t.Fatalf("heartbeat answered with op %d; want 11", f.Op)
		}
	}
}
