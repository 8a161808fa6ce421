package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// waitFor waits until shard id logs one of the events after offset from
// and returns its name and the offset after it.
func (e *env) waitFor(id int, from int64, names ...string) (string, int64) {
	e.t.Helper()
	l := e.events(id)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		ch := l.Notify()
		off := from
		for _, line := range strings.SplitAfter(logText(l, from), "\n") {
			off += int64(len(line))
			for _, n := range names {
				if field(line, "event") == n {
					return n, off
				}
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			e.t.Fatalf("shard %d: none of %v after offset %d; events:\n%s", id, names, from, logText(l, 0))
			return "", 0
		}
	}
}

// The issue-11 scenario against the simulator: session_start_limit.total
// 5, two shards, shard 0 forced into new sessions until the budget is
// spent, and no discovery before the start, so that the first
// connection's own discovery answers while its identify is in flight. No
// identify goes beyond the limit (the simulator would reset the token and
// every shard would go FATAL), the automatic ones leave the reserve, the
// operator's identify may spend it, the waiting shard says why and until
// when, and shard 1 is untouched.
func TestBudgetNeverOverspent(t *testing.T) {
	e := newEnv(t, envConfig{shards: 2, noDiscover: true, sim: gatewaysim.Config{SessionStartLimit: 5, MaxConcurrency: 2}})
	e.node.Start()
	e.waitEvent(0, 0, "ready")
	// Until discovery said max_concurrency 2, shard 1 queued behind shard 0.
	e.clk.Advance(core.DiscordWindow)
	e.waitEvent(1, 0, "ready")
	m1 := e.mark(1)

	identifies := func() (n int64) {
		for _, st := range e.sim.AllStats() {
			n += st.Identifies
		}
		return n
	}
	waiting := false
	for range 6 {
		m := e.mark(0)
		e.sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession})
		e.waitBackoff(0, m)
		e.clk.Advance(5 * time.Second)
		if e.diag(0).Phase.String() == "wait-identify-budget" {
			waiting = true
			break
		}
		if ev, _ := e.waitFor(0, m, "ready", "fatal"); ev != "ready" {
			t.Fatalf("shard 0 went FATAL after %d identifies (limit 5):\n%s", identifies(), logText(e.node.Events(), 0))
		}
	}
	if !waiting {
		t.Fatalf("shard 0 never waited for the budget; the simulator counted %d identifies (limit 5)", identifies())
	}
	if n := identifies(); n != 4 {
		t.Errorf("the simulator counted %d identifies before the reserve; want 4 (5 less a reserve of 1)", n)
	}
	text := string(func() []byte { d := e.diag(0); return d.AppendText(nil, e.clk.Now()) }())
	// The simulator's period began with the first identify, at the start;
	// the pacer, whose first answer counted nothing, allows that identify
	// a minute to arrive.
	if !strings.Contains(text, "phase wait-identify-budget\nidentify_wait_until 2026-12-01T07:01:00Z\n") {
		t.Errorf("shard 0's diag does not say it waits for the budget:\n%s", text)
	}

	// The operator may spend the reserve; then nothing is left, for anyone.
	m := e.mark(0)
	if err := e.node.ExecShard(0, "identify"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(0)
	if ev, _ := e.waitFor(0, m, "ready", "fatal"); ev != "ready" {
		t.Fatalf("the operator's identify: %s", ev)
	}
	if err := e.node.ExecShard(0, "identify"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Minute)
	if d := e.diag(0); d.Phase.String() != "wait-identify-budget" {
		t.Errorf("with no start left the operator's identify is in phase %s; want wait-identify-budget", d.Phase)
	}
	if n := identifies(); n != 5 {
		t.Errorf("the simulator counted %d identifies; want exactly 5", n)
	}
	if d := e.diag(1); d.State != core.Ready || d.Reconnects != 0 || d.Identifies != 1 {
		t.Errorf("shard 1: state %s, %d reconnects, %d identifies; want READY, 0, 1", d.State, d.Reconnects, d.Identifies)
	}
	if rest := logText(e.events(1), m1); rest != "" {
		t.Errorf("shard 1 logged after it came READY:\n%s", rest)
	}
}
