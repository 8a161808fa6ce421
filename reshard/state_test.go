package reshard

import (
	"testing"
)

// TestStateMoves: moveLocked makes exactly the moves stateMoves lists,
// refuses (false, state unchanged) a listed move from a state the mover
// is no longer in, and panics on any other.
func TestStateMoves(t *testing.T) {
	for from := range numStates {
		for to := range numStates {
			listed := stateMoves[from].Has(to)
			var seen [][2]State
			m := &Mover{state: from, onMove: func(f, t State) { seen = append(seen, [2]State{f, t}) }}
			got, panicked := tryMove(m, from, to)
			if panicked != !listed {
				t.Errorf("moveLocked(%v, %v) panicked = %v; want %v (listed: %v)", from, to, panicked, !listed, listed)
			}
			if !listed {
				if m.state != from || len(seen) != 0 {
					t.Errorf("moveLocked(%v, %v), not listed: state %v, moves %v; want %v, none", from, to, m.state, seen, from)
				}
				continue
			}
			if !got || m.state != to || len(seen) != 1 || seen[0] != [2]State{from, to} {
				t.Errorf("moveLocked(%v, %v) = %v, state %v, moves %v; want true, %v, one", from, to, got, m.state, seen, to)
			}
			// Another goroutine moved it first.
			other := (from + 1) % numStates
			m.state, seen = other, nil
			if got, _ := tryMove(m, from, to); got || m.state != other || len(seen) != 0 {
				t.Errorf("moveLocked(%v, %v) in %v = %v, state %v; want false, unchanged", from, to, other, got, m.state)
			}
		}
	}
}

func tryMove(m *Mover, from, to State) (ok, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.moveLocked(from, to), false
}

// TestStateTable checks the table against what /reshard promises: every
// state is reached from idle, a running move ends (switched, aborted or
// refused) and nothing else starts while it runs, and nothing goes back
// to idle.
func TestStateTable(t *testing.T) {
	reached := states(Idle)
	for changed := true; changed; {
		changed = false
		for s := range numStates {
			if reached.Has(s) && reached|stateMoves[s] != reached {
				reached |= stateMoves[s]
				changed = true
			}
		}
	}
	for s := range numStates {
		if !reached.Has(s) {
			t.Errorf("%v is not reachable from idle", s)
		}
		if stateMoves[s].Has(Idle) {
			t.Errorf("%v may move back to idle: %v", s, stateMoves[s])
		}
		if s.running() && stateMoves[s].Has(Checking) {
			t.Errorf("%v, a running move, may start another: %v", s, stateMoves[s])
		}
		if !s.running() && stateMoves[s] != settled {
			t.Errorf("%v, no move running, moves to %v; want %v", s, stateMoves[s], settled)
		}
	}
	if want := states(Switched, Aborted); stateMoves[Starting] != want {
		t.Errorf("starting moves to %v; want %v: a new plan that runs is switched to or aborted, never refused", stateMoves[Starting], want)
	}
	if got := State(numStates).String(); got != "state(6)" {
		t.Errorf("State(%d).String() = %q; want state(6)", numStates, got)
	}
	for s := range numStates {
		if s.String() != stateNames[s] || s.String() == "" {
			t.Errorf("State(%d).String() = %q", s, s.String())
		}
	}
}
