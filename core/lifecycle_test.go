package core_test

import (
	"testing"

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
