package core

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// TestLifecycleMoves: moveLocked makes exactly the moves stateMoves lists,
// noting when; staying in a state is no move; any other move panics and
// leaves the shard where it was.
func TestLifecycleMoves(t *testing.T) {
	then, now := clock.Epoch, clock.Epoch.Add(time.Minute)
	for from := range numStates {
		for to := range numStates {
			listed := stateMoves[from].Has(to)
			s := &shard{node: &Scheduler{}, id: 7, state: from, since: then}
			panicked := tryMove(s, to, now)
			switch {
			case from == to:
				if listed || panicked || s.state != from || !s.since.Equal(then) {
					t.Errorf("moveLocked(%v, %v): listed %v, panicked %v, state %v since %v; want unlisted, no panic, %v since %v",
						from, to, listed, panicked, s.state, s.since, from, then)
				}
			case listed:
				if panicked || s.state != to || !s.since.Equal(now) {
					t.Errorf("moveLocked(%v, %v): panicked %v, state %v since %v; want %v since %v", from, to, panicked, s.state, s.since, to, now)
				}
			default:
				if !panicked || s.state != from || !s.since.Equal(then) {
					t.Errorf("moveLocked(%v, %v) unlisted: panicked %v, state %v since %v; want a panic, %v since %v", from, to, panicked, s.state, s.since, from, then)
				}
			}
		}
	}
}

func tryMove(s *shard, to State, now time.Time) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	s.moveLocked(to, now)
	return false
}

// TestLifecycleTable checks the table against the promises of DESIGN.md
// section 2: every state is reached from ASSIGNED and nothing goes back
// to it; only a shard with a connection (STARTING, READY) reaches READY
// or FATAL; FATAL is left only for a start (retry) or a stop; and the
// panic handling's moves (to BACKOFF, or STOPPED after Close, from any
// state but FATAL and STOPPED) are listed, so that it cannot panic
// itself.
func TestLifecycleTable(t *testing.T) {
	connected := states(Starting, Ready)
	for from := range numStates {
		moves := stateMoves[from]
		if moves.Has(Assigned) {
			t.Errorf("%v moves to %v; nothing goes back to ASSIGNED", from, moves)
		}
		if moves.Has(from) {
			t.Errorf("%v moves to %v; staying is not a move", from, moves)
		}
		if !connected.Has(from) && (moves.Has(Ready) || moves.Has(Fatal)) {
			t.Errorf("%v moves to %v; only a shard with a connection reaches READY or FATAL", from, moves)
		}
		if from == Fatal && moves&^states(Starting, Stopped) != 0 {
			t.Errorf("FATAL moves to %v; want only {STARTING STOPPED}", moves)
		}
		if from != Fatal && from != Stopped {
			for _, to := range []State{Backoff, Stopped} {
				if to != from && !moves.Has(to) {
					t.Errorf("%v moves to %v; the panic handling needs %v", from, moves, to)
				}
			}
		}
	}
	reached := states(Assigned)
	for range numStates {
		for st := range numStates {
			if reached.Has(st) {
				reached |= stateMoves[st]
			}
		}
	}
	if all := stateSet(1<<numStates - 1); reached != all {
		t.Errorf("states reached from ASSIGNED: %v; want %v", reached, all)
	}
}
