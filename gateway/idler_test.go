package gateway

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// An idle connection gives up its reader goroutine and keeps its session:
// it still receives every event, heartbeats, and closes with 4000 (the
// session stays resumable) when the node stops.
func TestIdleConnectionsPark(t *testing.T) {
	if !canPark {
		t.Skip("connections park on Linux only")
	}
	const n = 4
	e := newEnv(t, envConfig{shards: n})
	e.start()
	// events sends k events to every shard and waits until each has them.
	events := func(k int) {
		for id := range n {
			e.publish(id, k)
			e.synced(id)
		}
	}
	wantParked := func() {
		t.Helper()
		e.waitParked(n)
		waitNoReaders(t)
	}
	// After READY and its burst, a connection parks at its first wait. A
	// burst whose tail arrives just after that wakes it at once, and a
	// reader woken at once waits a second before it parks again: one event
	// a second later settles both cases.
	e.clk.Advance(2 * parkAfter)
	events(1)
	wantParked()
	// Woken at once, they keep their reader; a reader that then waited a
	// second (of the connection's clock) for its last byte parks at its
	// next wait.
	events(1)
	e.waitParked(0)
	e.clk.Advance(2 * parkAfter)
	events(1)
	wantParked()

	// Events wake them; woken at once, they keep their reader.
	events(3)
	e.waitParked(0)

	// Heartbeats go out and their ACKs come back while parked.
	e.clk.Advance(2 * parkAfter)
	events(1)
	// A heartbeat due during those 2 s may still wait for its ACK: the
	// next tick would find the connection a zombie.
	e.waitAcked()
	e.waitParked(n)
	// Two heartbeats each: a second one after an ACK the parked reader
	// missed would find the connection a zombie.
	// The simulator, on the same clock, closes 4009 1.5 intervals after a
	// heartbeat it has read: the clock moves in steps short enough that it
	// reads each heartbeat before its deadline can pass.
	before := e.sim.Totals().Heartbeats
	for k := int64(1); k <= 2; k++ {
		for range 6 {
			e.clk.Advance(10 * time.Minute)
			e.waitAcked()
		}
		e.simWait("a heartbeat from every shard", func() bool { return e.sim.Totals().Heartbeats >= before+k*n })
		e.waitAcked()
		e.waitParked(n)
	}
	for id := range n {
		if d := e.diag(id); d.State.String() != "READY" {
			t.Errorf("shard %d is %v after a parked heartbeat", id, d.State)
		}
	}

	// Closing the transport wakes every parked connection to send 4000.
	e.node.Close()
	e.tr.Close()
	for id := range n {
		ss := e.sim.Sessions(id)
		if len(ss) != 1 || ss[0].Live {
			t.Errorf("shard %d sessions after close: %+v; want one, resumable", id, ss)
		}
	}
}

// waitParked waits until n connections are parked: each parks when its
// reader has read what the simulator sent, which the test can only poll.
func (e *env) waitParked(n int) {
	e.t.Helper()
	if !poll(func() bool { return e.tr.idler.parkedCount() == n }) {
		e.t.Fatalf("%d connections parked; want %d", e.tr.idler.parkedCount(), n)
	}
}

// waitAcked waits until every connection has read the ACK of its last
// heartbeat, which comes from the simulator over the network.
func (e *env) waitAcked() {
	e.t.Helper()
	waiting := 0
	if !poll(func() bool {
		waiting = 0
		e.tr.mu.Lock()
		for c := range e.tr.conns {
			c.mu.Lock()
			if c.awaiting {
				waiting++
			}
			c.mu.Unlock()
		}
		e.tr.mu.Unlock()
		return waiting == 0
	}) {
		e.t.Fatalf("%d connections still wait for a heartbeat ACK", waiting)
	}
}

// waitNoReaders waits until no connection has a reader goroutine: a
// reader that parked its connection may still be returning.
func waitNoReaders(t testing.TB) {
	t.Helper()
	n := 0
	if !poll(func() bool {
		n = goroutinesIn("gateway.(*conn).run", "gateway.(*conn).resume")
		return n == 0
	}) {
		t.Fatalf("%d reader goroutines with every connection parked; want 0", n)
	}
}

// goroutinesIn counts goroutines with a frame in one of the functions.
func goroutinesIn(fns ...string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range fns {
			if strings.Contains(g, fn+"(") {
				n++
				break
			}
		}
	}
	return n
}

// More shards than maxDialing start at once: the ones over the bound wait
// their turn without a goroutine, and every one gets READY.
func TestDialsWaitTheirTurn(t *testing.T) {
	n := maxDialing + maxDialing/2
	e := newEnv(t, envConfig{shards: n})
	e.node.Start()
	e.tr.dialMu.Lock()
	queued := len(e.tr.dialQ) + e.tr.dialing
	e.tr.dialMu.Unlock()
	if queued > n {
		t.Fatalf("%d connections dialling or queued for %d shards", queued, n)
	}
	for id := range n {
		e.waitEvent(id, 0, "ready")
	}
	e.tr.dialMu.Lock()
	defer e.tr.dialMu.Unlock()
	if e.tr.dialing != 0 || len(e.tr.dialQ) != 0 {
		t.Errorf("after READY: %d dialling, %d queued; want none", e.tr.dialing, len(e.tr.dialQ))
	}
}

// TestParkCountsFromLastMessage: how long a connection waited for a byte
// counts from the end of the last message it read, not from when its
// reader got round to waiting or parking. The sink moves the clock on
// while the reader still handles a message, as a test (or a busy machine)
// may do between the sink's delivery and the reader's next wait: a
// connection idle for two seconds after that message must still count as
// idle, waiting in place (the first event) or parked (the second).
func TestParkCountsFromLastMessage(t *testing.T) {
	if !canPark {
		t.Skip("connections park on Linux only")
	}
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var clk atomic.Pointer[clock.Fake]
			ec := envConfig{}
			if tc.tls {
				ec = tlsEnvConfig(t)
			}
			setup := ec.tr
			ec.tr = func(c *Config, sim *gatewaysim.Server) {
				if setup != nil {
					setup(c, sim)
				}
				sink := c.Sink
				c.Sink = func(shard int, session string, seq int64, name string, d []byte) {
					sink(shard, session, seq, name, d)
					if name == "SLOW" {
						clk.Load().Advance(2 * parkAfter)
					}
				}
			}
			e := newEnv(t, ec)
			clk.Store(e.clk)
			e.start()
			event := func(name string) {
				t.Helper()
				if _, err := e.sim.Publish(0, gatewaysim.Event{Name: name}); err != nil {
					t.Fatal(err)
				}
				e.synced(0)
			}
			// The GUILD_CREATE after READY may wake the connection parked
			// after READY at once; an event two seconds later parks it
			// either way.
			e.clk.Advance(2 * parkAfter)
			event("MESSAGE_CREATE")
			e.waitParked(1)
			// Woken at once, the reader waits in place for the next byte,
			// which comes two seconds after SLOW was read: it parks after it.
			event("SLOW")
			event("MESSAGE_CREATE")
			e.waitParked(1)
			// Parked two seconds, the reader parks again right after SLOW,
			// and the next byte comes two seconds after SLOW was read: it
			// parks after that one too.
			e.clk.Advance(2 * parkAfter)
			event("SLOW")
			e.waitParked(1)
			event("MESSAGE_CREATE")
			e.waitParked(1)
			if d := e.diag(0); d.Reconnects != 0 || d.State != core.Ready {
				t.Errorf("after parked reads: %v, %d reconnects; want READY, none", d.State, d.Reconnects)
			}
		})
	}
}
