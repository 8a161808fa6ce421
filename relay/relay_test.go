package relay

import (
	"bytes"
	"cmp"
	"compress/zlib"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/journal"
)

const (
	testToken = "MTIz.relay.token"
	botID     = "1000"
	allIntent = validIntents
)

// shardLog is a shard's dispatch journal written as shardfs.Tree writes
// it.
type shardLog struct {
	id  int
	log *journal.Log
	seq int64
}

func (l *shardLog) dispatch(t, d string) {
	l.seq++
	s := strconv.FormatInt(l.seq, 10)
	if t == "RESUMED" {
		s = "null"
	}
	l.log.Append([]byte(fmt.Sprintf(`{"shard":%d,"s":%s,"t":%q,"d":%s}`+"\n", l.id, s, t, d)), time.Now())
}

func guildID(k int) string { return strconv.Itoa((k+1)<<22 | 1) }

// ready writes the upstream READY and a GUILD_CREATE for each of n guilds.
func (l *shardLog) ready(n int) {
	var gs []string
	for k := range n {
		gs = append(gs, `{"id":"`+guildID(k)+`","unavailable":true}`)
	}
	l.dispatch("READY", `{"v":10,"user":{"id":"`+botID+`","username":"bot","discriminator":"0","global_name":null,"avatar":null,"bot":true},"guilds":[`+strings.Join(gs, ",")+
		`],"session_id":"upstream-secret","resume_gateway_url":"wss://upstream.example","shard":[0,1],"application":{"id":"`+botID+`","flags":0}}`)
	for k := range n {
		l.dispatch("GUILD_CREATE", `{"id":"`+guildID(k)+`","name":"g","unavailable":false,"member_count":1,"channels":[{"id":"7","type":0,"name":"general","guild_id":"`+guildID(k)+`"}],"roles":[{"id":"`+guildID(k)+`","name":"@everyone","permissions":"0"}],"members":[],"voice_states":[],"threads":[],"presences":[],"emojis":[],"stickers":[]}`)
	}
}

func (l *shardLog) message(k, n int) {
	l.dispatch("MESSAGE_CREATE", fmt.Sprintf(`{"id":"%d","channel_id":"7","guild_id":"%s","content":"m%d","author":{"id":"5"}}`, n, guildID(k), n))
}

type sent struct {
	shard   int
	payload string
}

type rig struct {
	t      testing.TB
	srv    *Server
	url    string
	shards map[int]*shardLog
	events *journal.Log
	clk    *clock.Fake

	mu      sync.Mutex
	sent    []sent
	refuse  error
	sentCh  chan struct{}
	wg      sync.WaitGroup
	closeLn func()
}

func newRig(t testing.TB, total int, local []int, mutate func(*Config)) *rig {
	t.Helper()
	return newRigSized(t, total, local, 1<<20, mutate)
}

// newRigSized is newRig with shard journals of retention bytes.
func newRigSized(t testing.TB, total int, local []int, retention int, mutate func(*Config)) *rig {
	t.Helper()
	r := &rig{t: t, shards: map[int]*shardLog{}, events: journal.New(1 << 20), clk: clock.NewFake(), sentCh: make(chan struct{}, 1)}
	for _, id := range local {
		r.shards[id] = &shardLog{id: id, log: journal.New(retention)}
	}
	cfg := Config{Token: testToken, Intents: allIntent, Total: total, Shards: local,
		Journal: func(id int) *journal.Log { return r.shards[id].log },
		Send: func(shard int, p []byte) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.refuse != nil {
				return r.refuse
			}
			r.sent = append(r.sent, sent{shard, string(p)})
			select {
			case r.sentCh <- struct{}{}:
			default:
			}
			return nil
		},
		Events: r.events, Clock: r.clk}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = s
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.url = "ws://" + l.Addr().String()
	r.wg.Go(func() { s.Serve(l) })
	t.Cleanup(func() {
		s.Close()
		r.wg.Wait()
		if ev := string(readAll(r.events)); strings.Contains(ev, testToken) || strings.Contains(ev, "upstream-secret") {
			t.Errorf("the events log shows a secret:\n%s", ev)
		}
	})
	return r
}

func (r *rig) sends() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.sent...)
}

// client is a bot's gateway connection, as a library makes it.
type client struct {
	t  testing.TB
	ws *websocket.Conn
	zr io.ReadCloser
	zb *bytes.Buffer
}

type frame struct {
	Op int             `json:"op"`
	S  *int64          `json:"s"`
	T  string          `json:"t"`
	D  json.RawMessage `json:"d"`
}

func (r *rig) dial(query string) *client {
	r.t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(r.url+"/?v=10&encoding=json"+query, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { ws.Close() })
	c := &client{t: r.t, ws: ws}
	if strings.Contains(query, "zlib-stream") {
		c.zb = new(bytes.Buffer)
	}
	if f := c.next(); f.Op != 10 {
		r.t.Fatalf("first frame op %d; want Hello (10)", f.Op)
	}
	return c
}

// next reads one frame; a close fails the test.
func (c *client) next() frame {
	c.t.Helper()
	f, err := c.read()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

func (c *client) read() (frame, error) {
	c.ws.SetReadDeadline(time.Now().Add(time.Minute)) // a hang's bound
	typ, msg, err := c.ws.ReadMessage()
	if err != nil {
		return frame{}, err
	}
	if c.zb != nil {
		if typ != websocket.BinaryMessage || !bytes.HasSuffix(msg, []byte{0, 0, 0xff, 0xff}) {
			return frame{}, fmt.Errorf("zlib-stream message of type %d ends % x; want binary ending 00 00 ff ff", typ, msg[max(len(msg)-4, 0):])
		}
		c.zb.Write(msg)
		if c.zr == nil {
			if c.zr, err = zlib.NewReader(c.zb); err != nil {
				return frame{}, err
			}
		}
		var out []byte
		buf := make([]byte, 64<<10)
		for c.zb.Len() > 0 {
			n, err := c.zr.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				return frame{}, err
			}
			if n == 0 {
				break
			}
		}
		msg = out
	}
	var f frame
	if err := json.Unmarshal(msg, &f); err != nil {
		return frame{}, fmt.Errorf("frame %q: %v", msg, err)
	}
	return f, nil
}

// closed reads until the connection closes and returns its code.
func (c *client) closed() int {
	c.t.Helper()
	for {
		_, err := c.read()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code
		}
		c.t.Fatalf("read: %v; want a close frame", err)
	}
}

func (c *client) send(v string) {
	c.t.Helper()
	if err := c.ws.WriteMessage(websocket.TextMessage, []byte(v)); err != nil {
		c.t.Fatal(err)
	}
}

func identify(token string, shard, total int, intents uint64) string {
	return fmt.Sprintf(`{"op":2,"d":{"token":%q,"intents":%d,"shard":[%d,%d],"properties":{"os":"linux","browser":"t","device":"t"}}}`, token, intents, shard, total)
}

// ready identifies and reads READY and the GUILD_CREATEs.
func (c *client) ready(shard, total, guilds int, intents uint64) (sessionID string, seq int64) {
	c.t.Helper()
	c.send(identify(testToken, shard, total, intents))
	f := c.next()
	if f.T != "READY" || *f.S != 1 {
		c.t.Fatalf("after identify: %s s=%v; want READY s=1", f.T, f.S)
	}
	var r struct {
		SessionID        string            `json:"session_id"`
		ResumeGatewayURL string            `json:"resume_gateway_url"`
		Shard            []int             `json:"shard"`
		Guilds           []json.RawMessage `json:"guilds"`
		User             struct{ ID string }
		Application      struct{ ID string }
		V                int
	}
	if err := json.Unmarshal(f.D, &r); err != nil {
		c.t.Fatal(err)
	}
	if r.SessionID == "" || r.SessionID == "upstream-secret" || !strings.HasPrefix(r.ResumeGatewayURL, "ws://127.0.0.1:") ||
		len(r.Shard) != 2 || r.Shard[0] != shard || r.Shard[1] != total || len(r.Guilds) != guilds || r.User.ID != botID || r.Application.ID != botID || r.V != 10 {
		c.t.Fatalf("READY = %s; want the relay's session, resume URL and shard, %d guilds, the bot's user and application", f.D, guilds)
	}
	seq = 1
	if intents&intentGuilds != 0 {
		for range guilds {
			f := c.next()
			seq++
			if f.T != "GUILD_CREATE" || *f.S != seq {
				c.t.Fatalf("frame %s s=%v; want GUILD_CREATE s=%d", f.T, f.S, seq)
			}
		}
	}
	return r.SessionID, seq
}

// A bot identifies and gets Hello, READY with the relay's own session, a
// GUILD_CREATE per guild from the cache, then the shard's dispatches with
// its own sequence numbers; heartbeats are answered locally.
func TestIdentifyReadyDispatch(t *testing.T) {
	r := newRig(t, 2, []int{0, 1}, nil)
	r.shards[1].ready(3)
	c := r.dial("")
	_, seq := c.ready(1, 2, 3, allIntent)
	for n := range 5 {
		r.shards[1].message(0, n)
	}
	for n := range 5 {
		f := c.next()
		seq++
		if f.T != "MESSAGE_CREATE" || *f.S != seq || !strings.Contains(string(f.D), fmt.Sprintf(`"m%d"`, n)) {
			t.Fatalf("frame %s s=%v %s; want MESSAGE_CREATE s=%d m%d", f.T, f.S, f.D, seq, n)
		}
	}
	c.send(`{"op":1,"d":42}`)
	if f := c.next(); f.Op != 11 {
		t.Fatalf("heartbeat answered with op %d; want 11", f.Op)
	}
	if s := r.sends(); len(s) != 0 {
		t.Errorf("upstream got %v; want nothing (heartbeats are the relay's)", s)
	}
	if got := string(r.srv.ClientsText()); !strings.HasPrefix(got, "1 1 127.0.0.1:") || !strings.Contains(got, " 9 0\n") {
		t.Errorf("/clients = %q; want client 1 on shard 1 at seq 9, lag 0", got)
	}
}

// The GUILD_CREATEs come from the cache, which follows later dispatches.
func TestCacheFollowsDispatches(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	l := r.shards[0]
	l.ready(2)
	l.dispatch("CHANNEL_CREATE", `{"id":"99","type":0,"name":"new","guild_id":"`+guildID(0)+`"}`)
	l.dispatch("CHANNEL_DELETE", `{"id":"7","type":0,"guild_id":"`+guildID(0)+`"}`)
	l.dispatch("GUILD_ROLE_CREATE", `{"guild_id":"`+guildID(0)+`","role":{"id":"55","name":"mods"}}`)
	l.dispatch("GUILD_MEMBER_ADD", `{"guild_id":"`+guildID(0)+`","user":{"id":"77"},"roles":[]}`)
	l.dispatch("GUILD_UPDATE", `{"id":"`+guildID(0)+`","name":"renamed"}`)
	l.dispatch("GUILD_DELETE", `{"id":"`+guildID(1)+`"}`)
	c := r.dial("")
	c.send(identify(testToken, 0, 1, allIntent))
	if f := c.next(); f.T != "READY" || strings.Contains(string(f.D), guildID(1)) {
		t.Fatalf("READY %s; want one guild, the deleted one gone", f.D)
	}
	f := c.next()
	var g struct {
		Name     string
		Channels []struct{ ID string }
		Roles    []struct{ ID string }
		Members  []struct{ User struct{ ID string } }
	}
	json.Unmarshal(f.D, &g)
	if f.T != "GUILD_CREATE" || g.Name != "renamed" || len(g.Channels) != 1 || g.Channels[0].ID != "99" || len(g.Roles) != 2 || len(g.Members) != 1 {
		t.Fatalf("GUILD_CREATE %s; want renamed, channel 99 only, two roles, member 77", f.D)
	}
	if st := string(r.srv.Status()); !strings.Contains(st, "cache guilds,channels,roles,members,voice_states\n") || strings.Contains(st, "cache_bytes_channels 0\n") {
		t.Errorf("/relay = %q; want the default kinds and their bytes", st)
	}
}

// A client gets only what its intents cover; GUILD_CREATEs only with
// GUILDS.
func TestIntentsFilter(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	l := r.shards[0]
	l.ready(1)
	dmOnly := r.dial("")
	dmOnly.ready(0, 1, 1, intentDirectMessages)
	l.message(0, 1)                                                                                                      // guild message: not for dmOnly
	l.dispatch("MESSAGE_CREATE", `{"id":"2","channel_id":"8","content":"dm","author":{"id":"5"}}`)                       // DM
	l.dispatch("TYPING_START", `{"channel_id":"7","guild_id":"`+guildID(0)+`","user_id":"5","timestamp":1}`)             // needs typing
	l.dispatch("INTERACTION_CREATE", `{"id":"3","type":2,"token":"x","guild_id":"`+guildID(0)+`","application_id":"1"}`) // always
	for _, want := range []string{`"dm"`, `"type":2`} {
		if f := dmOnly.next(); !strings.Contains(string(f.D), want) {
			t.Fatalf("DM-only client got %s %s; want the event with %s", f.T, f.D, want)
		}
	}
	if !covers(intentGuildMessages, "MESSAGE_CREATE", []byte(`{"guild_id":"1"}`)) || covers(intentGuildMessages, "MESSAGE_CREATE", []byte(`{"id":"1"}`)) ||
		covers(0, "PRESENCE_UPDATE", []byte(`{}`)) || !covers(0, "READY", nil) {
		t.Error("covers disagrees with the intents table")
	}
}

// A client's intents never exceed the node's.
func TestIntentsCappedByNode(t *testing.T) {
	r := newRig(t, 1, []int{0}, func(c *Config) { c.Intents = intentGuilds })
	r.shards[0].ready(1)
	c := r.dial("")
	c.ready(0, 1, 1, allIntent)
	r.shards[0].message(0, 1)
	r.shards[0].dispatch("GUILD_UPDATE", `{"id":"`+guildID(0)+`","name":"x"}`)
	if f := c.next(); f.T != "GUILD_UPDATE" {
		t.Fatalf("got %s; want GUILD_UPDATE (MESSAGE_CREATE is beyond the node's intents)", f.T)
	}
}

// Bad input gets what the real gateway sends.
func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		query string
		msgs  []string
		want  int
	}{
		{"wrong token", "", []string{identify("nope", 0, 2, 1)}, 4004},
		{"shard not served here", "", []string{identify(testToken, 1, 2, 1)}, 4010},
		{"wrong total", "", []string{identify(testToken, 0, 3, 1)}, 4010},
		{"no shard on a sharded bot", "", []string{`{"op":2,"d":{"token":"` + testToken + `","intents":1}}`}, 4011},
		{"invalid intents", "", []string{identify(testToken, 0, 2, 1<<30)}, 4013},
		{"no intents", "", []string{`{"op":2,"d":{"token":"` + testToken + `","shard":[0,2]}}`}, 4013},
		{"invalid JSON", "", []string{`{"op":1,`}, 4002},
		{"invalid UTF-8", "", []string{"{\"op\":1,\"d\":\"\xff\"}"}, 4002},
		{"too large", "", []string{`{"op":1,"d":"` + strings.Repeat("x", maxPayload) + `"}`}, 4002},
		{"ambiguous op", "", []string{`{"op":1,"Op":2}`}, 4002},
		{"unknown op", "", []string{`{"op":7,"d":null}`}, 4001},
		{"dispatch from a client", "", []string{`{"op":0,"d":null}`}, 4001},
		{"command before identify", "", []string{`{"op":3,"d":{"status":"online","since":null,"activities":[],"afk":false}}`}, 4003},
		{"identify twice", "", []string{identify(testToken, 0, 2, 1), identify(testToken, 0, 2, 1)}, 4005},
		{"flood", "", func() []string {
			m := make([]string, sendLimit+1)
			for i := range m {
				m[i] = `{"op":1,"d":null}`
			}
			return m
		}(), 4008},
		{"version", "&v=6", nil, 4012},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 2, []int{0}, nil)
			r.shards[0].ready(1)
			ws, _, err := websocket.DefaultDialer.Dial(r.url+"/?encoding=json"+cmp.Or(tc.query, "&v=10"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			c := &client{t: t, ws: ws}
			for _, m := range tc.msgs {
				if ws.WriteMessage(websocket.TextMessage, []byte(m)) != nil {
					break // closed already
				}
			}
			if got := c.closed(); got != tc.want {
				t.Errorf("close %d; want %d", got, tc.want)
			}
			if s := r.sends(); len(s) != 0 {
				t.Errorf("upstream got %v; want nothing", s)
			}
		})
	}
}

// A RESUME within the window replays what the client missed, exactly
// once, then RESUMED; a forged session id and a session past the window
// get op 9 false.
func TestResume(t *testing.T) {
	r := newRig(t, 1, []int{0}, func(c *Config) { c.ResumeWindow = time.Minute })
	l := r.shards[0]
	l.ready(2)
	c := r.dial("")
	id, seq := c.ready(0, 1, 2, allIntent)
	for n := range 3 {
		l.message(0, n)
	}
	for range 3 {
		c.next()
	}
	seq += 3
	// The bot dies having processed seq-1: the last event comes again.
	c.ws.Close()
	r.waitFor("the session detached", func() bool { return r.srv.Clients()[0].Remote == "-" })
	for n := 3; n < 6; n++ {
		l.message(0, n)
	}
	c = r.dial("")
	c.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":%q,"seq":%d}}`, testToken, id, seq-1))
	for n := 2; n < 6; n++ {
		f := c.next()
		if f.T != "MESSAGE_CREATE" || *f.S != seq+int64(n)-2 || !strings.Contains(string(f.D), fmt.Sprintf(`"m%d"`, n)) {
			t.Fatalf("replay: %s s=%v %s; want m%d at s=%d", f.T, f.S, f.D, n, seq+int64(n)-2)
		}
	}
	if f := c.next(); f.T != "RESUMED" {
		t.Fatalf("after the replay: %s; want RESUMED", f.T)
	}
	l.message(0, 6)
	if f := c.next(); f.T != "MESSAGE_CREATE" || *f.S != seq+4 || !strings.Contains(string(f.D), `"m6"`) {
		t.Fatalf("live after resume: %s s=%v %s; want m6 at s=%d", f.T, f.S, f.D, seq+4)
	}

	forged := r.dial("")
	forged.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":"0123456789abcdef0123456789abcdef","seq":1}}`, testToken))
	if f := forged.next(); f.Op != 9 || string(f.D) != "false" {
		t.Fatalf("forged session: op %d d %s; want op 9 false", f.Op, f.D)
	}
	// The socket stays open for an identify, as on Discord.
	forged.ready(0, 1, 2, allIntent)

	c.ws.Close()
	r.waitFor("the session detached", func() bool { return r.srv.Clients()[0].Remote == "-" })
	r.clk.Advance(time.Minute + time.Second)
	late := r.dial("")
	late.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":%q,"seq":%d}}`, testToken, id, seq+4))
	if f := late.next(); f.Op != 9 || string(f.D) != "false" {
		t.Fatalf("past the window: op %d d %s; want op 9 false", f.Op, f.D)
	}
	if ev := string(readAll(r.events)); !strings.Contains(ev, "event=relay-resume ") || !strings.Contains(ev, "resume window passed") {
		t.Errorf("events log lacks the resume and the expiry:\n%s", ev)
	}
}

// waitFor waits for cond, looking again at each line of the events log:
// the relay writes one after every change of a client's state.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	bound := time.After(time.Minute)
	for {
		ch := r.events.Notify()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-bound:
			r.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func readAll(l *journal.Log) []byte {
	b := make([]byte, l.Size())
	n, _ := l.ReadAt(b, 0)
	return b[:n]
}

// A client that identifies before the shard's own READY waits for it,
// and gets READY once the cache has read it.
func TestIdentifyWaitsForShardReady(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	c := r.dial("")
	c.send(identify(testToken, 0, 1, allIntent))
	r.waitFor("the identify", func() bool { return strings.Contains(string(readAll(r.events)), "event=relay-connect") })
	r.shards[0].ready(1)
	if f := c.next(); f.T != "READY" {
		t.Fatalf("got %s; want READY", f.T)
	}
	if f := c.next(); f.T != "GUILD_CREATE" {
		t.Fatalf("got %s; want GUILD_CREATE", f.T)
	}
}

// Across a clean restart with the saved state, a client resumes against
// the new process: what it missed before the stop comes from the saved
// tail, what the shard got since from the new journal, each once, in
// order; the cache (READY, GUILD_CREATEs) is the saved one.
func TestResumeAcrossRestart(t *testing.T) {
	r1 := newRig(t, 1, []int{0}, nil)
	l := r1.shards[0]
	l.ready(2)
	c := r1.dial("")
	id, seq := c.ready(0, 1, 2, allIntent)
	l.message(0, 0)
	c.next()
	seq++
	c.ws.Close()
	r1.waitFor("the session detached", func() bool { return r1.srv.Clients()[0].Remote == "-" })
	l.message(0, 1) // missed before the stop
	r1.srv.Close()
	var state bytes.Buffer
	if err := r1.srv.Save(&state); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(state.String(), testToken) {
		t.Error("the saved state holds the token")
	}

	r2 := newRig(t, 1, []int{0}, func(c *Config) { c.State = &state })
	r2.shards[0].message(0, 2) // the shard's own resume replayed it after the restart
	c = r2.dial("")
	c.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":%q,"seq":%d}}`, testToken, id, seq))
	for n := 1; n <= 2; n++ {
		f := c.next()
		if f.T != "MESSAGE_CREATE" || *f.S != seq+int64(n) || !strings.Contains(string(f.D), fmt.Sprintf(`"m%d"`, n)) {
			t.Fatalf("after the restart: %s s=%v %s; want m%d at s=%d", f.T, f.S, f.D, n, seq+int64(n))
		}
	}
	if f := c.next(); f.T != "RESUMED" {
		t.Fatalf("got %s; want RESUMED", f.T)
	}
	fresh := r2.dial("")
	fresh.ready(0, 1, 2, allIntent) // READY and two GUILD_CREATEs from the saved cache
	if cs := r2.srv.Clients(); len(cs) != 2 || cs[0].ID != 1 || cs[1].ID != 2 {
		t.Errorf("clients %+v; want the resumed 1 and a new 2", cs)
	}
}
