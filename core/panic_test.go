package core_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/lease/local"
)

// faults panics, when armed, inside Transport.Connect or the pacer's
// Request for one shard: the calls the core makes into code it does not own.
type faults struct {
	mu      sync.Mutex
	shard   int
	connect bool // panic in Transport.Connect
	request bool // panic in IdentifyPacer.Request
}

func (f *faults) arm(shard int, connect, request bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shard, f.connect, f.request = shard, connect, request
}

func (f *faults) fires(shard int, connect bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return shard == f.shard && (connect && f.connect || !connect && f.request)
}

type faultTransport struct {
	*coretest.Transport
	f *faults
}

func (t faultTransport) Connect(l *core.Link, a core.Attempt) core.Conn {
	if t.f.fires(a.Shard, true) {
		panic(fmt.Sprintf("transport exploded on shard %d", a.Shard))
	}
	return t.Transport.Connect(l, a)
}

type faultPacer struct {
	core.IdentifyPacer
	f *faults
}

func (p faultPacer) Request(shard int, op bool, grant func()) (bool, func()) {
	if p.f.fires(shard, false) {
		panic(fmt.Sprintf("pacer exploded on shard %d", shard))
	}
	return p.IdentifyPacer.Request(shard, op, grant)
}

// newFaultEnv is newEnv with a transport and a pacer that panic on demand.
func newFaultEnv(t *testing.T, mc int) (*env, *faults) {
	t.Helper()
	f := &faults{shard: -1}
	e := &env{t: t, clk: clock.NewFake(), tr: &coretest.Transport{}}
	e.lease = local.New(e.clk)
	n, err := core.New(core.Config{
		Plan:      core.Range(4, 0, 3),
		Transport: faultTransport{e.tr, f},
		Pacer:     faultPacer{core.NewDiscordPacer(e.clk, mc), f},
		Clock:     e.clk, Lease: e.lease, Backoff: core.Fixed(5 * time.Second),
		Rand:           func() float64 { return 0.5 },
		EventRetention: 1 << 20, NodeEventRetention: 8 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.node = n
	t.Cleanup(n.Close)
	return e, f
}

// Rule: per-shard isolation covers panics in the code the core calls out
// to. Whatever entry into a shard meets a panic in Transport.Connect or the
// pacer, the panic stays inside the core, the shard ends in BACKOFF with the
// panic in its events, the other shards carry on, and the shard connects
// again at its deadline.
func TestPanicInConnectOrPacerIsATransientFailure(t *testing.T) {
	const victim = 1
	for _, tc := range []struct {
		name    string
		mc      int
		setup   func(e *env)
		connect bool // else the pacer panics
		enter   func(e *env)
	}{
		{name: "Scheduler.Start/connect", connect: true, enter: func(e *env) { e.node.Start() }},
		{name: "Scheduler.Start/pacer", enter: func(e *env) { e.node.Start() }},
		{name: "reset/connect", setup: (*env).startAll, connect: true, enter: func(e *env) { e.node.ExecShard(victim, "reset") }},
		{name: "reset all/connect", setup: (*env).startAll, connect: true, enter: func(e *env) { e.node.ExecNode("reset all") }},
		{name: "identify/pacer", setup: (*env).startAll, enter: func(e *env) { e.node.ExecShard(victim, "identify") }},
		{name: "start/connect", setup: func(e *env) { e.startAll(); e.exec(victim, "stop") }, connect: true,
			enter: func(e *env) { e.node.ExecNode("start all") }},
		{name: "retry/pacer", setup: func(e *env) {
			e.startAll()
			e.conn(victim).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: 4004})
		}, enter: func(e *env) { e.node.ExecShard(victim, "retry") }},
		{name: "lease command/connect", setup: func(e *env) {
			e.startAll()
			e.exec(-1, "lease 10s")
			e.clk.Advance(10 * time.Second)
		}, connect: true, enter: func(e *env) { e.node.ExecNode("lease 1h") }},
		{name: "SetLease/connect", setup: func(e *env) {
			e.startAll()
			e.exec(-1, "lease 10s")
			e.clk.Advance(10 * time.Second)
		}, connect: true, enter: func(e *env) { e.node.SetLease(core.LeaseGrant{Shard: victim, Generation: 2}) }},
		// No connection while the shard waits for its slot: the panic
		// has no link to fail.
		{name: "backoff timer/pacer", setup: func(e *env) {
			e.node.Start()
			e.conn(victim).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		}, enter: func(e *env) { e.clk.Advance(5 * time.Second) }},
		{name: "slot granted/connect", mc: 1, setup: func(e *env) { e.node.Start() }, connect: true,
			enter: func(e *env) { e.clk.Advance(core.DiscordWindow) }},
		{name: "op 9/pacer", setup: (*env).startAll, enter: func(e *env) { e.conn(victim).Link.Invalidated() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := tc.mc
			if mc == 0 {
				mc = 16
			}
			e, f := newFaultEnv(t, mc)
			if tc.setup != nil {
				tc.setup(e)
			}
			conns := len(e.tr.Conns())
			f.arm(victim, tc.connect, !tc.connect)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("the panic escaped the core: %v", r)
					}
				}()
				tc.enter(e)
			}()
			f.arm(-1, false, false)

			d := e.diag(victim)
			if d.State != core.Backoff || d.LastError == nil || !strings.Contains(d.LastError.Error(), "exploded") {
				t.Fatalf("shard %d after the panic: %v, error %v; want BACKOFF with the panic as its error\n%s", victim, d.State, d.LastError, e.events(victim))
			}
			if ev := e.events(victim); !strings.Contains(ev, "event=panic") || !strings.Contains(ev, "exploded") {
				t.Fatalf("shard %d events lack the panic:\n%s", victim, ev)
			}
			for _, id := range []int{0, 2, 3} {
				if s := e.diag(id).State; s == core.Assigned || s == core.Backoff {
					t.Errorf("shard %d is %v after shard %d's panic", id, s, victim)
				}
				if strings.Contains(e.events(id), "exploded") {
					t.Errorf("shard %d events mention shard %d's panic", id, victim)
				}
			}
			e.clk.Advance(time.Minute)
			if d := e.diag(victim); d.State != core.Starting || len(e.tr.Conns()) <= conns || e.tr.Last(victim) == nil {
				t.Fatalf("shard %d a minute after the panic: %v with %d connections (%d before); want STARTING on a new connection\n%s",
					victim, d.State, len(e.tr.Conns()), conns, e.events(victim))
			}
		})
	}
}

// A Transport that panics on every Connect, under a policy whose first
// delay is zero (a resumable session, jitter drawn at 0), meets a timer
// each time, not a recursion: each panic is one failure, one reconnect,
// one step of the backoff.
func TestPanicOnEveryConnectBacksOff(t *testing.T) {
	f := &faults{shard: 1, connect: true}
	clk := clock.NewFake()
	tr := &coretest.Transport{}
	n, err := core.New(core.Config{
		Plan: core.Range(4, 0, 3), Transport: faultTransport{tr, f}, Clock: clk,
		Pacer: core.NewDiscordPacer(clk, 16), Backoff: core.DefaultBackoff, Rand: func() float64 { return 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	f.arm(-1, false, false)
	n.Start()
	tr.Last(1).Link.Ready(core.Session{ID: secretSession}, 1)
	f.arm(1, true, false)
	// The reset reconnects at once; the panic is the first failure of a
	// resumable session, whose delay is 0 here.
	if err := n.ExecShard(1, "reset"); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 5 * time.Second, 10 * time.Second, 20 * time.Second}
	for i, w := range want {
		d, _ := n.Diag(1)
		if d.State != core.Backoff || d.Reconnects != uint64(i+2) || d.RetryDelay != w {
			t.Fatalf("panic %d: %v after %d reconnects, waiting %v; want BACKOFF after %d, waiting %v", i+1, d.State, d.Reconnects, d.RetryDelay, i+2, w)
		}
		clk.Advance(d.RetryDelay)
	}
}

// panicLease is a lease backend that panics on every call.
type panicLease struct{}

func (panicLease) Arm([]int, time.Duration) ([]core.LeaseGrant, error) {
	panic("lease backend exploded in Arm")
}
func (panicLease) Off([]int) ([]core.LeaseGrant, error) { panic("lease backend exploded in Off") }

// A panic in the lease backend, called from a lease command, stays in the
// core: the command is refused with an error that says so, the panic and its
// stack go to the node's events, no shard changes, and the node takes the
// next command (the lease lock is not left held).
func TestPanicInLeaseBackendRefusesTheCommand(t *testing.T) {
	for _, tc := range []struct {
		shard    int // -1: the node's ctl
		line, in string
	}{
		{-1, "lease 10s", "Arm"},
		{-1, "lease off", "Off"},
		{2, "lease 10s", "Arm"},
	} {
		t.Run(fmt.Sprint(tc.shard, tc.line), func(t *testing.T) {
			clk := clock.NewFake()
			tr := &coretest.Transport{}
			n, err := core.New(core.Config{
				Plan: core.Range(4, 0, 3), Transport: tr, Clock: clk, Lease: panicLease{},
				Pacer: core.NewDiscordPacer(clk, 16), NodeEventRetention: 1 << 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			n.Start()
			for id := range 4 {
				tr.Last(id).Link.Ready(core.Session{ID: secretSession}, 1)
			}
			for range 2 { // twice: the first must not leave the lease lock held
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("the panic escaped Node.ExecNode: %v", r)
						}
					}()
					if tc.shard < 0 {
						err = n.ExecNode(tc.line)
					} else {
						err = n.ExecShard(tc.shard, tc.line)
					}
				}()
				if err == nil || !strings.Contains(err.Error(), "lease backend") || !strings.Contains(err.Error(), "exploded in "+tc.in) {
					t.Fatalf("ExecNode(%q) = %v; want an error naming the lease backend's panic", tc.line, err)
				}
			}
			ev := readLog(n.Events())
			if !strings.Contains(ev, "event=lease-panic") || !strings.Contains(ev, "exploded in "+tc.in) || !strings.Contains(ev, "goroutine") {
				t.Fatalf("node events lack the panic with its stack:\n%s", ev)
			}
			for id := range 4 {
				if d, _ := n.Diag(id); d.State != core.Ready || d.Lease.Generation != 0 {
					t.Errorf("shard %d after the refused lease command: %v, generation %d; want READY, untouched", id, d.State, d.Lease.Generation)
				}
			}
		})
	}
}

// readLog returns what l retains.
func readLog(l *journal.Log) string {
	buf := make([]byte, l.Size()-l.Oldest())
	n, _ := l.ReadAt(buf, l.Oldest())
	return string(buf[:n])
}
