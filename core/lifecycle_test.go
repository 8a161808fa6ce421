package core_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// A FATAL close (4004, 4010-4014) ends the session: retry starts a new
// one instead of resuming a session the gateway no longer has.
func TestFatalCloseEndsSession(t *testing.T) {
	for _, code := range []int{4004, 4010, 4011, 4012, 4013, 4014} {
		e := newEnv(t, core.Config{})
		e.startAll()
		e.conn(0).Link.Dispatch(7)
		e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: code})
		if d := e.diag(0); d.State != core.Fatal || d.Session != "invalid" {
			t.Fatalf("close %d: %v with session %s; want FATAL with session invalid", code, d.State, d.Session)
		}
		e.exec(0, "retry")
		if a := e.conn(0).Attempt; a.Resume {
			t.Fatalf("retry after close %d resumed %+v; want an identify", code, a)
		}
		if d := e.diag(0); d.State != core.Starting || d.SequenceValid {
			t.Fatalf("retry after close %d: %v with sequence %d valid=%v; want STARTING with sequence none", code, d.State, d.Sequence, d.SequenceValid)
		}
	}
}

// Nothing connects after Close: not a lease grant that arrives late (an
// etcd answer, a lease command in flight), not Start, not a timer.
func TestNothingConnectsAfterClose(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.exec(-1, "lease 10s")
	e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.clk.Advance(10 * time.Second)
	for id := range 4 {
		e.wantState(id, core.Stopped)
	}
	e.node.Close()
	n := len(e.tr.Conns())
	for id := range 4 {
		e.node.SetLease(core.LeaseGrant{Shard: id, Deadline: e.clk.Now().Add(time.Hour), Generation: 2})
	}
	e.node.SetLease(core.LeaseGrant{Shard: 0, Generation: 3}) // off
	e.node.Start()
	if n := e.clk.Pending(); n != 0 {
		t.Errorf("%d timers armed after Close", n)
	}
	e.clk.Advance(time.Hour)
	if got := len(e.tr.Conns()); got != n {
		t.Fatalf("%d connections after Close; want none", got-n)
	}
	for id := range 4 {
		e.wantState(id, core.Stopped)
	}
	if err := e.node.ExecNode("start all"); !errors.Is(err, core.ErrBusy) {
		t.Fatalf("start all after Close = %v; want ErrBusy", err)
	}
}

// The failure count starts again after 60 s in READY however the session
// ends: a request to reconnect at once (op 7) honoured at once included,
// so that the next drop backs off from the first step, not an old count.
func TestFailureCountResetsAfterReadyWhateverEndsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(e *env)
	}{
		{"op 7 at once", func(e *env) {
			e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop, Deadline: e.clk.Now()})
		}},
		{"reset", func(e *env) { e.exec(0, "reset") }},
		{"stop and start", func(e *env) { e.exec(0, "stop"); e.exec(0, "start") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, core.Config{Backoff: core.DefaultBackoff})
			e.startAll()
			for range 3 { // delays 50 ms, 10 s, 20 s: the count is 3
				e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
				e.clk.Advance(e.diag(0).RetryDelay)
			}
			e.conn(0).Link.Resumed(1)
			e.clk.Advance(core.ReadyReset)
			tc.end(e)
			if d := e.diag(0); d.State != core.Starting || !e.conn(0).Attempt.Resume {
				t.Fatalf("after the session ended: %v, resume=%v; want STARTING by resume", d.State, e.conn(0).Attempt.Resume)
			}
			e.conn(0).Link.Resumed(1)
			e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
			if d := e.diag(0).RetryDelay; d != 50*time.Millisecond {
				t.Fatalf("the first drop after %v READY waits %v; want 50ms (count reset, resumable)", core.ReadyReset, d)
			}
		})
	}
}

// Epochs are unique across the node: shards that reach READY in the same
// millisecond get different epochs, and no epoch is handed out twice.
func TestEpochsUniqueAcrossNode(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(8, 0, 7)})
	e.startAll()
	seen := map[uint64]int{}
	note := func(step string) {
		t.Helper()
		for id := range 8 {
			ep := e.diag(id).Epoch
			if other, ok := seen[ep]; ok && other != id {
				t.Fatalf("%s: shards %d and %d share epoch %d", step, other, id, ep)
			}
			seen[ep] = id
		}
	}
	note("all READY at once")
	if len(seen) != 8 {
		t.Fatalf("%d epochs for 8 new sessions", len(seen))
	}
	e.exec(-1, "identify all")
	e.clk.Advance(core.DiscordWindow)
	for id := range 8 {
		e.ready(id, 1)
	}
	note("all identified again")
	if len(seen) != 16 {
		t.Fatalf("%d epochs for 16 new sessions; one was reused", len(seen))
	}
}

// reset is logged like any failure in every state that accepts it: one
// backoff line with err="operator reset", one reconnect, then the retry.
func TestResetAlwaysLogsOperatorReset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mc    int
		setup func(e *env)
		want  core.State
	}{
		{"READY", 16, (*env).startAll, core.Ready},
		{"STARTING, connecting", 16, func(e *env) { e.node.Start() }, core.Starting},
		{"STARTING, waiting for a slot", 1, func(e *env) { e.node.Start() }, core.Starting},
		{"BACKOFF", 16, func(e *env) {
			e.startAll()
			e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		}, core.Backoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, core.Config{}, maxConcurrency(tc.mc))
			tc.setup(e)
			e.wantState(1, tc.want)
			before := e.diag(1)
			size := len(e.events(1))
			e.exec(1, "reset")
			added := e.events(1)[size:]
			if n := strings.Count(added, `event=backoff state=BACKOFF reconnects=`+fmt.Sprint(before.Reconnects+1)+` err="operator reset"`); n != 1 {
				t.Errorf("reset from %v logged %d backoff lines with the operator's reset; want 1:\n%s", tc.want, n, added)
			}
			if !strings.Contains(added, "event=retry state=STARTING") {
				t.Errorf("reset from %v logged no retry:\n%s", tc.want, added)
			}
			if d := e.diag(1); d.Reconnects != before.Reconnects+1 || d.State != core.Starting {
				t.Errorf("reset from %v: %v after %d reconnects; want STARTING after %d", tc.want, d.State, d.Reconnects, before.Reconnects+1)
			}
		})
	}
}

// A failure that repeats on every resume (a replay larger than the frame
// limit) does not keep the shard resuming forever: after
// core.MaxFailedResumes resumes in a row that the gateway took and that
// failed, the shard starts a new session and says why. A connection that
// failed before its Resume went out is not a failed resume, and a RESUMED
// starts the count again.
func TestRepeatedResumeFailureStartsNewSession(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.conn(0).Link.Dispatch(5)
	drop := func() {
		e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop, Code: 1009})
		e.clk.Advance(5 * time.Second)
	}
	failResume := func(step string) {
		t.Helper()
		c := e.conn(0)
		if !c.Attempt.Resume {
			t.Fatalf("%s: the shard identified; want a resume", step)
		}
		c.Link.Phase(core.PhaseResume)
		drop()
	}
	drop() // the session drops: the shard resumes
	failResume("first resume")
	e.conn(0).Link.Resumed(6) // a success starts the count again
	drop()
	for i := 1; i < core.MaxFailedResumes; i++ {
		failResume(fmt.Sprint("resume ", i))
	}
	drop() // never reached the gateway: not a failed resume
	if strings.Contains(e.events(0), "event=new-session") {
		t.Fatalf("new session after %d failed resumes:\n%s", core.MaxFailedResumes-1, e.events(0))
	}
	failResume(fmt.Sprint("resume ", core.MaxFailedResumes))
	if a := e.conn(0).Attempt; a.Resume {
		t.Fatalf("after %d failed resumes in a row the shard resumed again: %+v", core.MaxFailedResumes, a)
	}
	want := fmt.Sprintf(`event=new-session reason="%d resumes in a row failed"`, core.MaxFailedResumes)
	if ev := e.events(0); strings.Count(ev, want) != 1 {
		t.Fatalf("events do not say once why the shard identified (%q):\n%s", want, ev)
	}
	if d := e.diag(0); d.Session != "invalid" || d.SequenceValid {
		t.Fatalf("after giving up the session: session %s, sequence valid %v; want invalid, none", d.Session, d.SequenceValid)
	}
}
