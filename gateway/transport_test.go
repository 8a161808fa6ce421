package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

func TestDiscover(t *testing.T) {
	for _, f := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(f.String(), func(t *testing.T) {
			flavor := gatewaysim.Discord
			if f == core.Fluxer {
				flavor = gatewaysim.Fluxer
			}
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: flavor, Shards: 12, MaxConcurrency: 4, SessionStartUsed: 10, Clock: clock.NewFake()})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			d, err := Discover(ctx, client, f, sim.APIURL(), "Bot "+testToken)
			if err != nil {
				t.Fatalf("Discover() = %v", err)
			}
			if d.URL != sim.GatewayURL() {
				t.Errorf("Discover().URL = %q; want %q", d.URL, sim.GatewayURL())
			}
			wantShards, wantLimit := 12, core.StartLimit{Total: 1000, Remaining: 990, ResetAfter: 24 * time.Hour, MaxConcurrency: 4}
			if f == core.Fluxer {
				wantShards, wantLimit = 1, core.StartLimit{Total: 1000, Remaining: 999, ResetAfter: 4 * time.Hour, MaxConcurrency: 1}
			}
			if d.Shards != wantShards || d.StartLimit != wantLimit {
				t.Errorf("Discover() = %d shards, %+v; want %d, %+v", d.Shards, d.StartLimit, wantShards, wantLimit)
			}

			_, err = Discover(ctx, client, f, sim.APIURL(), "wrong-token-1234")
			if !errors.Is(err, ErrUnauthorized) {
				t.Errorf("Discover(wrong token) = %v; want ErrUnauthorized", err)
			}
			if err != nil && strings.Contains(err.Error(), "wrong-token-1234") {
				t.Errorf("Discover(wrong token) error %q quotes the token", err)
			}

			// The transport hands Discord's limits to the pacer, and never
			// Fluxer's constants.
			var got []core.StartLimit
			tr, err := New(Config{Flavor: f, Token: testToken, API: sim.APIURL(), HTTPClient: client,
				OnStartLimit: func(l core.StartLimit) { got = append(got, l) }})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if _, err := tr.Discover(ctx); err != nil {
				t.Fatal(err)
			}
			if f == core.Discord && (len(got) != 1 || got[0] != wantLimit) || f == core.Fluxer && len(got) != 0 {
				t.Errorf("OnStartLimit calls = %+v; want the Discord limit once, never Fluxer's", got)
			}
		})
	}
}

// fakeAPI serves GET /gateway/bot from a list of URLs, one per request
// (the last one repeated), and counts requests.
type fakeAPI struct {
	srv  *httptest.Server
	urls []string
	n    atomic.Int32
}

func newFakeAPI(t *testing.T, urls ...string) *fakeAPI {
	a := &fakeAPI{urls: urls}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(a.n.Add(1)) - 1
		u := a.urls[min(i, len(a.urls)-1)]
		fmt.Fprintf(w, `{"url":%q,"shards":1,"session_start_limit":{"total":1000,"remaining":1000,"reset_after":0,"max_concurrency":16}}`, u)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// TestDiscoverySingleFlight: connections that need the URL at the same
// time share one discovery request.
func TestDiscoverySingleFlight(t *testing.T) {
	gate, first := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			close(first)
		}
		<-gate
		fmt.Fprint(w, `{"url":"ws://127.0.0.1:1/","shards":1}`)
	}))
	defer api.Close()
	tr, err := New(Config{Flavor: core.Discord, Token: testToken, API: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			u, err := tr.gatewayURL(ctx)
			if err == nil && u != "ws://127.0.0.1:1/" {
				err = fmt.Errorf("gatewayURL() = %q", u)
			}
			errs <- err
		}()
	}
	<-first
	close(gate)
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("8 concurrent connections made %d discovery requests; want 1", got)
	}
}

// TestDiscoveryRefresh: a discovered URL that fails to connect is dropped
// and discovered anew.
func TestDiscoveryRefresh(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "ws://" + dead.Addr().String() + "/"
	dead.Close()

	api := newFakeAPI(t, deadURL)
	e := newEnv(t, envConfig{noDiscover: true, tr: func(c *Config, sim *gatewaysim.Server) {
		c.API = api.srv.URL
		api.urls = append(api.urls, sim.GatewayURL())
	}})
	e.node.Start()
	off := e.waitBackoff(0, 0)
	if line := logText(e.events(0), 0)[:off]; !strings.Contains(line, "tcp=failed") {
		t.Errorf("backoff line %q; want tcp=failed", line)
	}
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, 0, "ready")
	if n := api.n.Load(); n != 2 {
		t.Errorf("discovery requests = %d; want 2 (the failed URL is dropped)", n)
	}
}

// selfSigned is gatewaysim.SelfSigned for a test.
func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
	cert, pool, err := gatewaysim.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	return cert, pool
}

// tlsEnvConfig returns an environment whose simulator serves wss:// with
// a certificate that only the client's transport trusts.
func tlsEnvConfig(t testing.TB) envConfig {
	cert, pool := selfSigned(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tln := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	wss := "wss://" + ln.Addr().String() + "/"
	return envConfig{sim: gatewaysim.Config{Listener: tln}, noDiscover: true, tr: func(c *Config, _ *gatewaysim.Server) {
		c.GatewayURL = wss
		c.TLSConfig = &tls.Config{RootCAs: pool}
	}}
}

// TestTLS runs a shard over wss://: every layer reports ok, a drop resumes
// over TLS, and a certificate the client does not trust is a TLS failure.
func TestTLS(t *testing.T) {
	ec := tlsEnvConfig(t)
	e := newEnv(t, ec)
	wss := e.tr.cfg.GatewayURL
	e.start()
	if cs := e.diag(0).Conn; cs != (core.ConnState{TCP: core.LayerOK, TLS: core.LayerOK, WS: core.LayerOK}) {
		t.Errorf("Diag().Conn = %+v; want every layer ok", cs)
	}
	if canPark {
		// An idle TLS connection parks like a plain one, and events of
		// every size, a record or many, still arrive whole and in order.
		e.clk.Advance(2 * parkAfter)
		e.publish(0, 1)
		e.synced(0)
		e.waitParked(1)
		for _, size := range []int{10, 3000, 16 << 10, 70 << 10, 5} {
			e.clk.Advance(2 * parkAfter)
			d := fmt.Sprintf(`{"content":%q}`, strings.Repeat("x", size))
			if _, err := e.sim.Publish(0, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(d)}); err != nil {
				t.Fatal(err)
			}
			e.synced(0)
			e.waitParked(1)
		}
		waitNoReaders(t)
		if d := e.diag(0); d.Reconnects != 0 || d.State != core.Ready {
			t.Errorf("after parked reads over TLS: %v, %d reconnects; want READY, none", d.State, d.Reconnects)
		}
	}
	m := e.drop(0)
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, m, "resumed")

	// A second node that trusts nothing.
	clk := clock.NewFake()
	tr, err := New(Config{Flavor: core.Discord, Token: testToken, GatewayURL: wss, Clock: clk, TLSConfig: &tls.Config{RootCAs: x509.NewCertPool()}})
	if err != nil {
		t.Fatal(err)
	}
	node, err := core.New(core.Config{Plan: core.Range(1, 0, 0), Transport: tr, Clock: clk, Backoff: core.Fixed(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	node.Start()
	l, _ := node.ShardEvents(0)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		// The channel is taken before the log is read: a line appended in
		// between still wakes the wait.
		ch := l.Notify()
		if strings.Contains(logText(l, 0), "event=backoff") {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("no backoff after a TLS failure:\n%s", logText(l, 0))
		}
	}
	if text := logText(l, 0); !strings.Contains(text, "tcp=ok tls=failed") || !strings.Contains(text, "tls:") {
		t.Errorf("events %q; want a TLS failure with tcp=ok tls=failed", text)
	}
	node.Close()
	tr.Close()
}

// TestHeartbeats checks the schedule (first beat after interval × jitter,
// then every interval), that each beat carries the sequence the sink has
// already seen (Fluxer trims its replay buffer to it), and that ACKs keep
// the connection from counting as a zombie.
func TestHeartbeats(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			// Fluxer's requests for heartbeats (op 1) would race the
			// schedule; the fault matrix covers them.
			sc := gatewaysim.Config{HeartbeatInterval: 10 * time.Second, HeartbeatRequestAfter: -1}
			e := newEnv(t, envConfig{flavor: v.flavor, compress: v.compress, sim: sc,
				tr: func(c *Config, _ *gatewaysim.Server) { c.Rand = func() float64 { return 0.25 } }})
			e.start()
			var c *conn
			e.tr.mu.Lock()
			for x := range e.tr.conns {
				c = x
			}
			e.tr.mu.Unlock()
			c.mu.Lock()
			first := c.hbNext.Sub(clock.Epoch)
			c.mu.Unlock()
			if first != 2500*time.Millisecond {
				t.Errorf("first heartbeat due %v after Hello; want 2.5s (10s × 0.25)", first)
			}
			for beat := int64(1); beat <= 3; beat++ {
				e.publish(0, 2)
				e.synced(0)
				want := e.sink.last(0)
				if beat == 1 {
					e.clk.Advance(2500 * time.Millisecond)
				} else {
					e.clk.Advance(10 * time.Second)
				}
				e.simWait(fmt.Sprintf("heartbeat %d", beat), func() bool { return e.sim.Stats(0).Heartbeats == beat })
				// The reader records a sequence right after the sink
				// returns, so the heartbeat may trail the sink by the
				// latest event, never lead it.
				if got := e.sim.Sessions(0)[0].Acked; got > want || got < want-1 {
					t.Errorf("heartbeat %d carried sequence %d; want %d, the last one processed", beat, got, want)
				}
				// The ACK is queued before this event: once the event
				// is in, the ACK was read.
				e.publish(0, 1)
				e.synced(0)
			}
			if d := e.diag(0); d.State != core.Ready || d.Reconnects != 0 {
				t.Errorf("after three acknowledged heartbeats: state %v, %d reconnects; want READY, 0", d.State, d.Reconnects)
			}
		})
	}
}

// TestRealClock runs one shard on real time with a 250 ms heartbeat
// interval: heartbeats flow and the latency of their round trip reaches
// the core. (At 50 ms, the simulator's 75 ms zombie limit was within the
// scheduling delays of a loaded 2-core machine running the race
// detector: a reconnect now and then.)
func TestRealClock(t *testing.T) {
	// The heartbeats are counted, not judged: a client late by a
	// scheduling hiccup on a loaded machine was closed 4009 at the
	// simulator's default 12/11 of 250 ms, and reconnected.
	sim, err := gatewaysim.New(gatewaysim.Config{HeartbeatInterval: 250 * time.Millisecond, HeartbeatTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	tr, err := New(Config{Flavor: core.Discord, Token: testToken, GatewayURL: sim.GatewayURL(), Intents: 1})
	if err != nil {
		t.Fatal(err)
	}
	node, err := core.New(core.Config{Plan: core.Range(1, 0, 0), Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	node.Start()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.Wait(ctx, func() bool { return sim.Stats(0).Heartbeats >= 4 }); err != nil {
		t.Fatalf("heartbeats = %d: %v", sim.Stats(0).Heartbeats, err)
	}
	if d, _ := node.Diag(0); d.State != core.Ready || d.Latency <= 0 || d.Reconnects != 0 {
		t.Errorf("Diag = state %v latency %v reconnects %d; want READY, a latency, no reconnect", d.State, d.Latency, d.Reconnects)
	}
	node.Close()
	tr.Close()
}

// TestSend sends operator commands through the core on every variant
// (Fluxer's zstd stream included), and refuses oversized ones.
func TestSend(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, envConfig{flavor: v.flavor, compress: v.compress})
			e.start()
			m := e.mark(0)
			for i := range 5 {
				p := fmt.Sprintf(`{"op":3,"d":{"since":null,"activities":[],"status":"online","afk":false,"n":%d}}`, i)
				if err := e.node.Send(0, []byte(p)); err != nil {
					t.Fatalf("Send(%s) = %v", p, err)
				}
			}
			// A command the simulator could not decode would close 4002
			// before this event arrives.
			e.publish(0, 1)
			e.synced(0)
			if got := e.path(0, m); len(got) != 0 {
				t.Errorf("path after sending = %v; want nothing to happen", got)
			}
			var c *conn
			e.tr.mu.Lock()
			for x := range e.tr.conns {
				c = x
			}
			e.tr.mu.Unlock()
			big := []byte(`{"op":3,"d":"` + strings.Repeat("x", 4096) + `"}`)
			if err := c.Send(big); !errors.Is(err, core.ErrTooLarge) {
				t.Errorf("Send(%d bytes) = %v; want ErrTooLarge", len(big), err)
			}
		})
	}
}

// TestOperatorCommands checks the close codes the core passes through:
// reset and stop resume (4000 keeps the session), identify ends it (1000).
func TestOperatorCommands(t *testing.T) {
	e := newEnv(t, envConfig{shards: 1})
	e.start()
	e.publish(0, 2)
	e.synced(0)
	for _, cmd := range []struct {
		line, event         string
		identifies, resumes int64
	}{
		{"reset", "resumed", 0, 1},
		{"identify", "ready", 1, 0},
		{"stop", "stopped", 0, 0},
		{"start", "resumed", 0, 1},
	} {
		st, m := e.sim.Stats(0), e.mark(0)
		if err := e.node.ExecShard(0, cmd.line); err != nil {
			t.Fatalf("ExecShard(%q) = %v", cmd.line, err)
		}
		if cmd.line == "identify" {
			e.clk.Advance(5 * time.Second) // the bucket's next identify slot
		}
		e.waitEvent(0, m, cmd.event)
		if cmd.event != "stopped" {
			e.synced(0)
		} else {
			e.simWait("the session to detach", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
		}
		if cmd.line == "identify" {
			// The client closed with 1000: the old session is gone.
			e.simWait("the old session to end", func() bool { return len(e.sim.Sessions(0)) == 1 })
		}
		now := e.sim.Stats(0)
		if now.Identifies-st.Identifies != cmd.identifies || now.Resumes-st.Resumes != cmd.resumes {
			t.Errorf("%s: identifies += %d, resumes += %d; want %d, %d", cmd.line, now.Identifies-st.Identifies, now.Resumes-st.Resumes, cmd.identifies, cmd.resumes)
		}
	}
	if n, _ := e.sink.checkContiguous(t, 0); n != 2 {
		t.Errorf("sink saw %d sessions; want 2 (identify started one)", n)
	}
}

// TestResumeUnknownSession resumes a session the transport never saw start
// (as after a restart from a session store): the replay reaches the sink.
func TestResumeUnknownSession(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.start()
	e.publish(0, 2)
	e.synced(0)
	m := e.drop(0)
	e.tr.mu.Lock()
	e.tr.records = nil // forget what the sink has seen
	e.tr.mu.Unlock()
	e.publish(0, 3)
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, m, "resumed")
	e.synced(0)
	if _, last := e.sink.checkContiguous(t, 0); last != e.liveSeq(0) {
		t.Errorf("sink ends at %d; want the replay through %d", last, e.liveSeq(0))
	}
}

// TestShardRecord plays the race the core allows: a replaced connection
// still delivering while its successor replays the same events, then a
// new session. The sink must see each event of a session once, in order.
func TestShardRecord(t *testing.T) {
	rec := newRecorder()
	tr := &Transport{cfg: Config{Sink: rec.sink}}
	r := &shardRecord{session: "X", last: 3} // READY, then events 2 and 3
	old := &conn{t: tr, rec: r, sid: "X"}
	next := &conn{t: tr, rec: r, sid: "X", a: core.Attempt{Resume: true, Sequence: 3}}

	old.deliver(4, "E", nil) // the old reader was inside the sink when the core moved on
	next.claim()             // the core resumed from 3
	next.deliver(4, "E", nil)
	next.deliver(5, "E", nil)
	old.Close(4000)
	old.deliver(6, "E", nil) // a buffered event of the closed connection
	next.deliver(6, "E", nil)

	newer := &conn{t: tr, rec: r}
	r.mu.Lock()
	r.session, r.last = "Y", 1 // what READY of a new session records
	r.mu.Unlock()
	newer.sid = "Y"
	next.deliver(7, "E", nil) // the old session's connection after a newer READY
	newer.deliver(2, "E", nil)

	var got []int64
	for _, ev := range rec.get(0) {
		got = append(got, ev.seq)
	}
	if want := []int64{4, 5, 6, 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sink saw %v; want %v", got, want)
	}
}

// TestHelloTimeout: a gateway that accepts the upgrade but never says Hello
// is a transient failure once HelloTimeout passes on the clock.
func TestHelloTimeout(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.start()
	m := e.mark(0)
	// Sticky, and for every connection: a new one has no shard until it
	// identifies, so only an all-shards delay reaches its Hello.
	e.sim.Inject(gatewaysim.AllShards, gatewaysim.Fault{Kind: gatewaysim.FaultDelay, Delay: time.Hour})
	e.sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	e.waitBackoff(0, m)
	e.simWait("the old connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
	m = e.mark(0)
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, m, "retry")
	e.logs.waitFor(t, "gateway: connected", 2) // its Hello deadline is armed
	e.clk.Advance(20 * time.Second)
	off := e.waitBackoff(0, m)
	if line := logText(e.events(0), m)[:off-m]; !strings.Contains(line, "no Hello within 20s") || !strings.Contains(line, "ws=failed") {
		t.Errorf("events %q; want a Hello timeout", line)
	}
}

func TestIdentifyPayload(t *testing.T) {
	for _, f := range []core.Flavor{core.Discord, core.Fluxer} {
		tr, err := New(Config{Flavor: f, Token: "Bot abc", Intents: 513})
		if err != nil {
			t.Fatal(err)
		}
		c := &conn{t: tr, a: core.Attempt{Shard: 3, Total: 8}}
		p, err := c.identifyPayload()
		if err != nil {
			t.Fatal(err)
		}
		want := `{"op":2,"d":{"token":"abc","intents":513,"properties":{"os":"shardfs","browser":"shardfs","device":"shardfs"},"shard":[3,8]}}`
		if f == core.Fluxer {
			want = `{"op":2,"d":{"token":"abc","properties":{"os":"shardfs","browser":"shardfs","device":"shardfs"},"shard":[3,8]}}`
		}
		if string(p) != want {
			t.Errorf("%v identify = %s; want %s", f, p, want)
		}
		c.a = core.Attempt{Resume: true, Session: core.Session{ID: "sess"}, Sequence: 42}
		p, _ = c.resumePayload()
		if want := `{"op":6,"d":{"token":"abc","session_id":"sess","seq":42}}`; string(p) != want {
			t.Errorf("%v resume = %s; want %s", f, p, want)
		}
		tr.Close()
	}
}

// TestHandoverAfterTheLastFrame: the core's Handover returns once the
// connection's socket is closed (core.Ender): the transport holds no
// connection of the shard any more, so no frame of it can be written after
// the caller releases the shard to another node. Its last frame is the
// client's close 4000, which the gateway reads (the simulator reports the
// frame after answering it, so the test waits for the report).
func TestHandoverAfterTheLastFrame(t *testing.T) {
	closes := make(chan gatewaysim.Frame, 4)
	e := newEnv(t, envConfig{sim: gatewaysim.Config{OnFrame: func(f gatewaysim.Frame) {
		if f.Op == gatewaysim.OpClose && f.Shard == 0 {
			closes <- f
		}
	}}})
	e.start()
	e.synced(0)
	if _, err := e.node.Handover(0); err != nil {
		t.Fatal(err)
	}
	e.tr.mu.Lock()
	for c := range e.tr.conns {
		if c.a.Shard == 0 {
			t.Errorf("Handover returned while shard 0's connection (phase %v) was still open", c.phase())
		}
	}
	e.tr.mu.Unlock()
	select {
	case f := <-closes:
		if f.Code != 4000 || f.Reply {
			t.Fatalf("the gateway read %+v; want the client's close 4000", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway never read shard 0's close frame")
	}
}

// Abort (core.Aborter, issue 22 item 7) closes a live connection's socket
// at once: Ended closes without the close handshake.
func TestAbortClosesTheSocket(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.start()
	e.synced(0)
	var c *conn
	e.tr.mu.Lock()
	for x := range e.tr.conns {
		if x.a.Shard == 0 {
			c = x
		}
	}
	e.tr.mu.Unlock()
	if c == nil {
		t.Fatal("no connection of shard 0")
	}
	var a core.Aborter = c
	a.Abort()
	select {
	case <-c.Ended():
	case <-time.After(time.Minute): // a bound on a hang only
		t.Fatal("Ended never closed after Abort")
	}
}
