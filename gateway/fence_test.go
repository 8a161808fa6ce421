package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// fenceTransport hands every connection one fence the test controls, and
// no lease reaches the core: the core's lease timer never runs, as after a
// SIGCONT when a connection's overdue heartbeat timer fires before it.
type fenceTransport struct {
	core.Transport
	fence *core.Fence
}

func (f fenceTransport) Connect(l *core.Link, a core.Attempt) core.Conn {
	a.Fence = f.fence
	return f.Transport.Connect(l, a)
}

// The pause hazard against a real socket: once the fence has passed, the
// heartbeat that falls due is not written, the socket is dropped without a
// close frame, and the reconnect that follows writes nothing either (not
// even its HTTP upgrade): the simulator sees no heartbeat, identify or
// resume after the deadline, and the session stays resumable for the
// next owner.
func TestFenceDropsWithoutWriting(t *testing.T) {
	var ft *fenceTransport
	e := newEnv(t, envConfig{
		sim: gatewaysim.Config{HeartbeatInterval: 10 * time.Second, HeartbeatRequestAfter: -1},
		wrap: func(tr core.Transport) core.Transport {
			ft = &fenceTransport{Transport: tr}
			return ft
		},
	})
	ft.fence = core.NewFence(clock.Mono(e.clk) + 12*time.Second)
	e.start()
	// Before the deadline the first heartbeat (at half the interval, Rand
	// is 0.5) goes out: the check below can see one.
	e.clk.Advance(5 * time.Second)
	e.simWait("the first heartbeat", func() bool { return e.sim.Stats(0).Heartbeats == 1 })
	before := e.sim.Stats(0)

	m := e.mark(0)
	e.clk.Advance(10 * time.Second) // the next heartbeat is due at 15 s, past the fence at 12 s
	e.waitBackoff(0, m)
	e.simWait("the fenced connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
	m = e.mark(0)
	e.clk.Advance(5 * time.Second) // the backoff ends: the shard tries to resume
	e.waitEvent(0, m, "backoff")

	after := e.sim.Stats(0)
	if after.Heartbeats != before.Heartbeats || after.Identifies != before.Identifies || after.Resumes != before.Resumes || after.FailedResumes != 0 {
		t.Fatalf("frames after the fencing deadline: heartbeats %d -> %d, identifies %d -> %d, resumes %d -> %d (failed %d)",
			before.Heartbeats, after.Heartbeats, before.Identifies, after.Identifies, before.Resumes, after.Resumes, after.FailedResumes)
	}
	resumable := false
	for _, s := range e.sim.Sessions(0) {
		resumable = resumable || !s.Live
	}
	if !resumable {
		t.Fatalf("the session did not stay resumable: %+v", e.sim.Sessions(0))
	}
	if !strings.Contains(e.logs.String(), "fencing deadline passed") {
		t.Fatalf("no log line about the fenced write:\n%s", e.logs.String())
	}
}

// The fence covers reads: events the gateway sends after the deadline, read
// by a connection whose lease timer has not stopped it yet (a node woken
// from a pause), never reach the sink (dispatch logs, the relay).
func TestFenceDropsReads(t *testing.T) {
	var ft *fenceTransport
	e := newEnv(t, envConfig{
		wrap: func(tr core.Transport) core.Transport {
			ft = &fenceTransport{Transport: tr}
			return ft
		},
	})
	ft.fence = core.NewFence(clock.Mono(e.clk) + 12*time.Second)
	e.start()
	e.publish(0, 3)
	e.synced(0)
	before := e.sink.get(0)
	e.clk.Advance(13 * time.Second) // past the fence; no heartbeat falls due
	sent := e.sim.Stats(0).Dispatched
	e.publish(0, 5)
	e.simWait("the five events to be sent", func() bool { return e.sim.Stats(0).Dispatched == sent+5 })
	// The drop comes after the five events on the same socket: once the
	// shard backs off, its reader has read them all.
	e.drop(0)
	if after := e.sink.get(0); len(after) != len(before) {
		t.Fatalf("sink after the fence: %d events, %d before; want no new one: %v", len(after), len(before), after[len(before):])
	}
}

// deadlinePacer is a pacer whose slots must be used within 2 s of their
// grant (core.SlotDeadliner), as lease/etcd/identify's are.
type deadlinePacer struct {
	core.IdentifyPacer
	clk    *clock.Fake
	mu     sync.Mutex
	by     map[int]time.Duration
	unused int
}

func (p *deadlinePacer) Request(shard int, op bool, grant func()) (bool, func()) {
	stamp := func() {
		p.mu.Lock()
		p.by[shard] = clock.Mono(p.clk) + 2*time.Second
		p.mu.Unlock()
	}
	now, cancel := p.IdentifyPacer.Request(shard, op, func() { stamp(); grant() })
	if now {
		stamp()
	}
	return now, cancel
}

func (p *deadlinePacer) IdentifyBy(shard int) (time.Duration, func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	by, ok := p.by[shard]
	delete(p.by, shard)
	return by, func() {
		p.mu.Lock()
		p.unused++
		p.mu.Unlock()
	}, ok
}

// An identify that could only go out after its slot's identify-by deadline
// (a stall between the grant and the write: here the gate holds it 3 s)
// is not written: the slot is given back, the attempt fails, and the shard
// asks for a new slot, whose identify goes out in time.
func TestIdentifyByDeadline(t *testing.T) {
	clk := clock.NewFake()
	dp := &deadlinePacer{IdentifyPacer: core.NewDiscordPacer(clk, 1), clk: clk, by: map[int]time.Duration{}}
	stallUntil := clk.Now().Add(3 * time.Second)
	var stalls atomic.Int32
	e := newEnv(t, envConfig{
		clk:   clk,
		pacer: dp,
		tr: func(c *Config, _ *gatewaysim.Server) {
			c.IdentifyNotBefore = func(int) time.Time {
				if stalls.Add(1) == 1 {
					return stallUntil // the first identify stalls 3 s
				}
				return time.Time{}
			}
		},
	})
	m := e.mark(0)
	e.node.Start()
	e.clk.Advance(3 * time.Second)
	e.waitBackoff(0, m)
	if got := e.sim.Stats(0).Identifies; got != 0 {
		t.Fatalf("identifies the gateway saw after the stall = %d; want 0 (past the slot's deadline)", got)
	}
	dp.mu.Lock()
	unused := dp.unused
	dp.mu.Unlock()
	if unused != 1 {
		t.Fatalf("slots given back = %d; want 1", unused)
	}
	if !strings.Contains(e.logs.String(), "deadline passed before the identify") {
		t.Fatalf("no log line about the late identify:\n%s", e.logs.String())
	}
	e.clk.Advance(5 * time.Second) // the backoff ends: a new slot, in time
	e.synced(0)
	if got := e.sim.Stats(0).Identifies; got != 1 {
		t.Fatalf("identifies after the second slot = %d; want 1", got)
	}
	if got := e.pacer.requests(); got != 2 {
		t.Fatalf("slot requests = %d; want 2", got)
	}
}

// Every dispatch reaches the sink with its session's key (core.SessionKey
// of the id the gateway gave): the same key after a resume, on any node,
// so that (shard, session key, s) names an event and a reader can drop a
// copy; the id itself is never handed over.
func TestSinkSessionKey(t *testing.T) {
	var mu sync.Mutex
	var ids []string
	e := newEnv(t, envConfig{tr: func(c *Config, _ *gatewaysim.Server) {
		c.OnSession = func(_ int, s core.Session, _ int64) {
			mu.Lock()
			ids = append(ids, s.ID)
			mu.Unlock()
		}
	}})
	e.start()
	e.publish(0, 2)
	e.synced(0)
	e.drop(0)
	e.clk.Advance(5 * time.Second) // the backoff ends: the shard resumes
	e.publish(0, 2)
	e.synced(0)
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 1 || ids[0] == "" {
		t.Fatalf("sessions started: %d; want 1 (then a resume)", len(ids))
	}
	want := core.SessionKey(ids[0])
	evs := e.sink.get(0)
	if len(evs) < 5 {
		t.Fatalf("sink has %d events; want READY, 2 events, RESUMED, 2 events", len(evs))
	}
	for _, ev := range evs {
		if ev.session != want {
			t.Fatalf("event %d %s has session key %q; want %q for every event of the session", ev.seq, ev.name, ev.session, want)
		}
		if strings.Contains(ev.d, ids[0]) {
			t.Fatalf("event %d %s carries the session id", ev.seq, ev.name)
		}
	}
	if len(want) != 12 || strings.Contains(want, ids[0]) {
		t.Fatalf("SessionKey = %q; want 12 hex digits that do not contain the id", want)
	}
}

// switchConfirmer is a Confirmer the test turns from "the lease is alive"
// to "the lease is gone", as etcd would answer a node thawed after its
// lease expired there.
type switchConfirmer struct {
	gone  atomic.Bool
	calls atomic.Int64
}

func (c *switchConfirmer) Confirm(context.Context) error {
	c.calls.Add(1)
	if c.gone.Load() {
		return fmt.Errorf("%w: members/n1 is not on this node's lease", core.ErrUnconfirmed)
	}
	return nil
}

// A node thawed from a VM freeze: its clocks stood still, so its fence is
// open, but etcd says its lease is gone. The events the gateway sends
// after the thaw never reach the sink: the first is dropped unconfirmed
// (events line fenced-read), the shard stops (lease lost) and its socket
// closes without a frame written, so the session stays resumable for the
// node that took over.
func TestUnconfirmedReadsNeverReachTheSink(t *testing.T) {
	conf := &switchConfirmer{}
	e := newEnv(t, envConfig{confirm: conf})
	e.node.SetLease(core.LeaseGrant{Shard: 0, Owner: true, Generation: 7, Deadline: e.clk.Now().Add(time.Hour)})
	e.start()
	e.publish(0, 3)
	e.synced(0)
	before := e.sink.get(0)
	if conf.calls.Load() == 0 {
		t.Fatal("no confirmation asked before delivery")
	}
	stats := e.sim.Stats(0)

	conf.gone.Store(true)
	m := e.mark(0)
	e.publish(0, 5)
	e.waitEvent(0, m, "stopped")
	e.simWait("the socket to close", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
	if after := e.sink.get(0); len(after) != len(before) {
		t.Fatalf("sink after the lease was gone: %d events, %d before; want no new one: %v", len(after), len(before), after[len(before):])
	}
	d := e.diag(0)
	if d.State != core.Stopped || d.StopReason != core.StoppedByLeaseLost {
		t.Fatalf("shard 0: %v (%v); want STOPPED, lease lost", d.State, d.StopReason)
	}
	if ev := logText(e.events(0), m); !strings.Contains(ev, "event=fenced-read") || !strings.Contains(ev, "dropped=1") {
		t.Fatalf("events after the thaw lack fenced-read dropped=1:\n%s", ev)
	}
	after := e.sim.Stats(0)
	if after.Heartbeats != stats.Heartbeats || after.Identifies != stats.Identifies || after.Resumes != stats.Resumes {
		t.Fatalf("frames after the unconfirmed read: heartbeats %d -> %d, identifies %d -> %d, resumes %d -> %d",
			stats.Heartbeats, after.Heartbeats, stats.Identifies, after.Identifies, stats.Resumes, after.Resumes)
	}
	resumable := false
	for _, s := range e.sim.Sessions(0) {
		resumable = resumable || !s.Live
	}
	if !resumable {
		t.Fatalf("the session did not stay resumable: %+v", e.sim.Sessions(0))
	}
}
