package core_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// ObserveEvent sees every lifecycle event a shard handles, by kind, and
// none of its dispatches; an event from a stale link is timed too, since
// the core had to look at it.
func TestObserveEvent(t *testing.T) {
	var mu sync.Mutex
	var kinds []string
	e := newEnv(t, core.Config{ObserveEvent: func(kind string, d time.Duration) {
		if d < 0 {
			t.Errorf("ObserveEvent(%q, %v): negative duration", kind, d)
		}
		mu.Lock()
		kinds = append(kinds, kind)
		mu.Unlock()
	}})
	e.node.Start()
	e.ready(0, 1)
	c := e.conn(0)
	c.Link.Dispatch(2)
	c.Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	c.Link.Fail(core.Failure{Class: core.Transient, Err: errDrop}) // stale link
	e.clk.Advance(5 * time.Second)
	e.conn(0).Link.Resumed(2)
	e.exec(0, "lease 1s")
	e.clk.Advance(time.Second)

	mu.Lock()
	defer mu.Unlock()
	want := []string{core.EventReady, core.EventFail, core.EventFail, core.EventBackoffTimer, core.EventResumed, core.EventLeaseTimer}
	if !slices.Equal(kinds, want) {
		t.Errorf("observed %q; want %q", kinds, want)
	}
	for _, k := range kinds {
		if !slices.Contains(core.EventKinds, k) {
			t.Errorf("kind %q is not in EventKinds", k)
		}
	}
}
