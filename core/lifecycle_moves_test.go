package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// moveLog records the moves a node's shards make or attempt.
type moveLog struct {
	mu       sync.Mutex
	seen     map[[2]core.State]int
	unlisted []string
}

func watchMoves(n *core.Scheduler, log *moveLog) {
	n.SetOnMove(func(shard int, from, to core.State) {
		log.mu.Lock()
		defer log.mu.Unlock()
		if log.seen == nil {
			log.seen = map[[2]core.State]int{}
		}
		log.seen[[2]core.State{from, to}]++
		if !core.MoveListed(from, to) {
			log.unlisted = append(log.unlisted, fmt.Sprintf("shard %d: %v → %v", shard, from, to))
		}
	})
}

// panicOnStart is a slog handler that panics on the first "start" event
// it logs: a panic in the middle of a shard's first start.
type panicOnStart struct {
	slog.Handler
	once sync.Once
}

func (h *panicOnStart) Enabled(context.Context, slog.Level) bool { return true }

func (h *panicOnStart) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "start" {
		h.once.Do(func() { panic("logger exploded") })
	}
	return nil
}

// TestLifecycleMovesReached drives shards through real inputs (operator
// commands, transport events, lease expiry, Close, a panic, the fake
// clock) until every move the lifecycle table lists has been made, and
// checks that none it does not list was attempted.
func TestLifecycleMovesReached(t *testing.T) {
	var log moveLog
	fail := func(e *env, id int, class core.FailureClass) {
		e.conn(id).Link.Fail(core.Failure{Class: class, Err: errDrop, Code: 4000})
	}

	// ASSIGNED → STARTING → READY on every shard; then one shard in each
	// state, all of which a lease expiry stops.
	e := newEnv(t, core.Config{})
	watchMoves(e.node, &log)
	e.startAll()
	e.exec(0, "identify") // READY → STARTING
	fail(e, 1, core.Transient)
	e.wantState(1, core.Backoff)   // READY → BACKOFF
	e.clk.Advance(5 * time.Second) // BACKOFF → STARTING
	fail(e, 1, core.Transient)     // STARTING → BACKOFF
	fail(e, 2, core.FatalFailure)  // READY → FATAL
	e.exec(2, "retry")             // FATAL → STARTING
	fail(e, 2, core.FatalFailure)  // STARTING → FATAL
	e.exec(3, "stop")              // READY → STOPPED
	e.exec(3, "start")             // STOPPED → STARTING
	e.ready(3, 1)
	e.exec(-1, "lease 1s")
	e.clk.Advance(time.Second) // STARTING, READY, BACKOFF → STOPPED
	for id, want := range []core.State{core.Stopped, core.Stopped, core.Fatal, core.Stopped} {
		e.wantState(id, want)
	}
	e.exec(2, "retry") // FATAL → STOPPED: the lease forbids the start
	e.wantState(2, core.Stopped)
	e.exec(-1, "lease off") // STOPPED → STARTING

	// ASSIGNED → STOPPED: Close before Start.
	e = newEnv(t, core.Config{})
	watchMoves(e.node, &log)
	e.node.Close()
	e.wantState(0, core.Stopped)

	// ASSIGNED → BACKOFF: a panic in the middle of the first start.
	e = newEnv(t, core.Config{Plan: core.Range(1, 0, 0), Logger: slog.New(&panicOnStart{Handler: slog.DiscardHandler})})
	watchMoves(e.node, &log)
	e.node.Start()
	e.wantState(0, core.Backoff)

	log.mu.Lock()
	defer log.mu.Unlock()
	for _, u := range log.unlisted {
		t.Errorf("unlisted move attempted: %s", u)
	}
	for from := range core.NumStates {
		for to := range core.NumStates {
			if core.MoveListed(from, to) && log.seen[[2]core.State{from, to}] == 0 {
				t.Errorf("listed move %v → %v never made", from, to)
			}
		}
	}
}
