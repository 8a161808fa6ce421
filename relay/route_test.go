package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardfs/shardfs/journal"
)

// Op 8 goes to the shard's send path with a nonce of the relay's, and
// the chunks go to the client that asked, with its own nonce; the other
// client on the shard does not get them.
func TestMembersChunkByNonce(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	l := r.shards[0]
	l.ready(1)
	asker, other := r.dial(""), r.dial("")
	asker.ready(0, 1, 1, allIntent)
	other.ready(0, 1, 1, allIntent)
	asker.send(`{"op":8,"d":{"guild_id":"` + guildID(0) + `","query":"","limit":0,"nonce":"mine"}}`)
	r.waitSent(1)
	var req struct {
		Op int
		D  struct {
			Nonce   string
			GuildID string `json:"guild_id"`
		}
	}
	json.Unmarshal([]byte(r.sends()[0].payload), &req)
	if req.Op != 8 || req.D.Nonce == "mine" || req.D.Nonce == "" {
		t.Fatalf("upstream got %s; want op 8 with the relay's nonce", r.sends()[0].payload)
	}
	l.dispatch("GUILD_MEMBERS_CHUNK", fmt.Sprintf(`{"guild_id":"%s","members":[{"user":{"id":"9"}}],"chunk_index":0,"chunk_count":1,"nonce":%q}`, guildID(0), req.D.Nonce))
	l.message(0, 1)
	if f := asker.next(); f.T != "GUILD_MEMBERS_CHUNK" || !strings.Contains(string(f.D), `"nonce":"mine"`) {
		t.Fatalf("asker got %s %s; want the chunk with its nonce", f.T, f.D)
	}
	if f := other.next(); f.T != "MESSAGE_CREATE" {
		t.Fatalf("other client got %s %s; want the message, not the chunk", f.T, f.D)
	}
}

// Op 4 passes to the shard; the bot's own voice state and the voice
// server of that guild go to the client that sent it.
func TestVoiceToTheClientThatAsked(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	l := r.shards[0]
	l.ready(1)
	music, other := r.dial(""), r.dial("")
	music.ready(0, 1, 1, allIntent)
	other.ready(0, 1, 1, allIntent)
	music.send(`{"op":4,"d":{"guild_id":"` + guildID(0) + `","channel_id":"7","self_mute":false,"self_deaf":true}}`)
	r.waitSent(1)
	if p := r.sends()[0].payload; !strings.Contains(p, `"op":4`) {
		t.Fatalf("upstream got %s; want the op 4", p)
	}
	l.dispatch("VOICE_STATE_UPDATE", `{"guild_id":"`+guildID(0)+`","channel_id":"7","user_id":"`+botID+`","session_id":"v"}`)
	l.dispatch("VOICE_SERVER_UPDATE", `{"guild_id":"`+guildID(0)+`","token":"vt","endpoint":"voice.example"}`)
	l.dispatch("VOICE_STATE_UPDATE", `{"guild_id":"`+guildID(0)+`","channel_id":"7","user_id":"5","session_id":"u"}`)
	for _, want := range []string{"VOICE_STATE_UPDATE", "VOICE_SERVER_UPDATE", "VOICE_STATE_UPDATE"} {
		if f := music.next(); f.T != want {
			t.Fatalf("music client got %s; want %s", f.T, want)
		}
	}
	if f := other.next(); f.T != "VOICE_STATE_UPDATE" || !strings.Contains(string(f.D), `"user_id":"5"`) {
		t.Fatalf("other client got %s %s; want only the other user's voice state", f.T, f.D)
	}
}

// A command the shard's send path refuses (its bounded queue is full)
// closes the client 4008: nothing waits without bound.
func TestSendRefusedCloses4008(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	r.shards[0].ready(1)
	r.refuse = errors.New("busy: the send queue is full")
	c := r.dial("")
	c.ready(0, 1, 1, allIntent)
	c.send(`{"op":3,"d":{"status":"online","since":null,"activities":[],"afk":false}}`)
	if got := c.closed(); got != 4008 {
		t.Fatalf("close %d; want 4008", got)
	}
}

// With compress=zlib-stream every message is part of one zlib stream,
// each ending 00 00 ff ff, as Discord sends it.
func TestZlibStream(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	r.shards[0].ready(2)
	c := r.dial("&compress=zlib-stream")
	_, seq := c.ready(0, 1, 2, allIntent)
	r.shards[0].message(0, 1)
	if f := c.next(); f.T != "MESSAGE_CREATE" || *f.S != seq+1 {
		t.Fatalf("got %s s=%v; want MESSAGE_CREATE s=%d", f.T, f.S, seq+1)
	}
}

// GET /api/v10/gateway/bot answers with the relay's URL and the plan's
// total, with a token; other requests under /api/ go to the API
// unchanged, Authorization and rate-limit headers included.
func TestDiscoveryAndRESTPassThrough(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "4")
		w.WriteHeader(http.StatusCreated)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s %s", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), b)
	}))
	defer api.Close()
	r := newRig(t, 4, []int{0}, func(c *Config) { c.API = api.URL })
	base := "http" + strings.TrimPrefix(r.url, "ws")
	get := func(path, auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	code, body := get("/api/v10/gateway/bot", "Bot "+testToken)
	var d struct {
		URL               string
		Shards            int
		SessionStartLimit struct {
			Remaining      int
			MaxConcurrency int `json:"max_concurrency"`
		} `json:"session_start_limit"`
	}
	json.Unmarshal([]byte(body), &d)
	if code != 200 || d.URL != r.url || d.Shards != 4 || d.SessionStartLimit.Remaining < 1 || d.SessionStartLimit.MaxConcurrency < 1 {
		t.Errorf("gateway/bot = %d %s; want the relay's URL, 4 shards, a limit that never waits", code, body)
	}
	if code, _ := get("/api/v10/gateway/bot", "Bot wrong"); code != 401 {
		t.Errorf("gateway/bot with a wrong token = %d; want 401", code)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v10/channels/7/messages?x=1", strings.NewReader(`{"content":"hi"}`))
	req.Header.Set("Authorization", "Bot "+testToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if want := "POST /api/v10/channels/7/messages?x=1 Bot " + testToken + ` {"content":"hi"}`; res.StatusCode != 201 || string(b) != want || res.Header.Get("X-RateLimit-Remaining") != "4" {
		t.Errorf("pass-through = %d %q (rate limit %q); want 201 %q and the API's headers", res.StatusCode, b, res.Header.Get("X-RateLimit-Remaining"), want)
	}
}

// A client that reads slower than the shard's retention is closed 4009
// and its session ends; the other clients are unaffected.
func TestFellBehindRetention(t *testing.T) {
	small := journal.New(4 << 10)
	r2 := newRig(t, 1, []int{0}, func(c *Config) {
		c.Journal = func(int) *journal.Log { return small }
	})
	l := &shardLog{id: 0, log: small}
	l.ready(1)
	c := r2.dial("")
	c.ready(0, 1, 1, allIntent)
	// A client that does not read blocks its puller only once the TCP
	// buffers fill; holding the session's lock stops the puller before
	// its next event just the same, while the shard writes far more
	// than the retention.
	r2.srv.mu.Lock()
	s := r2.srv.clients[1]
	r2.srv.mu.Unlock()
	s.mu.Lock() // the puller blocks on this before its next event
	for n := range 200 {
		l.message(0, n)
	}
	s.mu.Unlock()
	if got := c.closed(); got != 4009 {
		t.Fatalf("close %d; want 4009", got)
	}
	r2.waitFor("the session ended", func() bool { return len(r2.srv.Clients()) == 0 })
}

// kick ends a client's session and closes it 4000; a resume gets op 9.
func TestKick(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	r.shards[0].ready(1)
	c := r.dial("")
	id, seq := c.ready(0, 1, 1, allIntent)
	if err := r.srv.Kick(2); !errors.Is(err, ErrUnknownClient) {
		t.Errorf("Kick(2) = %v; want ErrUnknownClient", err)
	}
	if err := r.srv.Kick(1); err != nil {
		t.Fatal(err)
	}
	if got := c.closed(); got != 4000 {
		t.Fatalf("close %d; want 4000", got)
	}
	c = r.dial("")
	c.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":%q,"seq":%d}}`, testToken, id, seq))
	if f := c.next(); f.Op != 9 {
		t.Fatalf("resume after kick: op %d; want 9", f.Op)
	}
}

func (r *rig) waitSent(n int) {
	r.t.Helper()
	bound := time.After(time.Minute)
	for len(r.sends()) < n {
		select {
		case <-r.sentCh:
		case <-bound:
			r.t.Fatalf("timed out waiting for %d commands upstream", n)
		}
	}
}

// Connections past MaxConns are refused before the upgrade, with a
// status that says the relay is full; the connected clients are
// unaffected.
func TestMaxConns(t *testing.T) {
	r := newRig(t, 1, []int{0}, func(c *Config) { c.MaxConns = 2 })
	r.shards[0].ready(1)
	a, b := r.dial(""), r.dial("")
	_, res, err := websocket.DefaultDialer.Dial(r.url+"/?v=10&encoding=json", nil)
	if err == nil || res == nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third connection: %v (%v); want 503", err, res)
	}
	a.ready(0, 1, 1, allIntent)
	b.ready(0, 1, 1, allIntent)
}

// The relay's metrics: clients, their events, lag and resumes, and the
// cache's bytes per kind.
func TestMetrics(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	r.shards[0].ready(1)
	c := r.dial("")
	c.ready(0, 1, 1, allIntent)
	r.shards[0].message(0, 1)
	c.next()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			name := mf.GetName()
			for _, l := range m.Label {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			got[name] = v
		}
	}
	for name, want := range map[string]float64{
		"shardfs_relay_clients":                               1,
		"shardfs_relay_connected_clients":                     1,
		"shardfs_relay_client_events_total,client=1,shard=0":  1,
		"shardfs_relay_client_resumes_total,client=1,shard=0": 0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v); want %v", name, v, ok, want)
		}
	}
	if got["shardfs_relay_cache_bytes,kind=channels"] == 0 {
		t.Errorf("cache bytes of channels = 0; want the cached channel's")
	}
}

// The tree's dispatch lines, with and without the session key (issue 22
// added it between t and d), parse to the same event.
func TestParseLineSessionKey(t *testing.T) {
	for _, line := range []string{
		`{"shard":1,"s":7,"t":"MESSAGE_CREATE","session":"0123456789ab","d":{"id":"1","content":"a,b"}}` + "\n",
		`{"shard":1,"s":7,"t":"MESSAGE_CREATE","session":null,"d":{"id":"1","content":"a,b"}}` + "\n",
		`{"shard":1,"s":7,"t":"MESSAGE_CREATE","d":{"id":"1","content":"a,b"}}` + "\n",
	} {
		e, ok := parseLine([]byte(line))
		if !ok || e.seq != 7 || string(e.t) != "MESSAGE_CREATE" || string(e.d) != `{"id":"1","content":"a,b"}` {
			t.Errorf("parseLine(%q) = seq %d t %q d %q, %v; want 7, MESSAGE_CREATE and the payload", line, e.seq, e.t, e.d, ok)
		}
	}
	if e, ok := parseLine([]byte(`{"shard":1,"s":null,"t":"RESUMED","session":"0123456789ab","d":null}` + "\n")); !ok || e.seq != -1 || string(e.d) != "null" {
		t.Errorf("a RESUMED line = %+v, %v; want seq -1 and d null", e, ok)
	}
}
