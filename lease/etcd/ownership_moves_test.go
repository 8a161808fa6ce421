package etcd

import (
	"errors"
	"slices"
	"testing"
)

// TestOwnershipMoves: moveLocked makes exactly the moves ownershipMoves
// lists, setting the /lease error with the state; staying only sets the
// error; any other move panics and changes nothing; and once the node has
// begun to leave, every state but left is refused quietly.
func TestOwnershipMoves(t *testing.T) {
	before, after := errors.New("before"), errors.New("after")
	for _, from := range ownershipStates {
		for _, to := range ownershipStates {
			listed := slices.Contains(ownershipMoves[from], to)
			o := &Ownership{state: from, lastErr: before}
			moved, panicked := tryOwnershipMove(o, to, after)
			switch {
			case from == to:
				if listed || panicked || !moved || o.state != from || o.lastErr != after {
					t.Errorf("moveLocked(%s, %s): listed %v, panicked %v, moved %v, state %s, error %v; want unlisted, no panic, moved, %s, %v",
						from, to, listed, panicked, moved, o.state, o.lastErr, from, after)
				}
			case listed:
				if panicked || !moved || o.state != to || o.lastErr != after {
					t.Errorf("moveLocked(%s, %s): panicked %v, moved %v, state %s, error %v; want %s, %v", from, to, panicked, moved, o.state, o.lastErr, to, after)
				}
			default:
				if !panicked || o.state != from || o.lastErr != before {
					t.Errorf("moveLocked(%s, %s) unlisted: panicked %v, state %s, error %v; want a panic, %s, %v", from, to, panicked, o.state, o.lastErr, from, before)
				}
			}
			// Drain has set left: Run's late writes are dropped.
			o = &Ownership{state: from, lastErr: before, left: true}
			moved, panicked = tryOwnershipMove(o, to, after)
			if to != StateLeft && (moved || panicked || o.state != from || o.lastErr != before) {
				t.Errorf("moveLocked(%s, %s) after left: moved %v, panicked %v, state %s; want refused quietly, %s", from, to, moved, panicked, o.state, from)
			}
		}
	}
}

func tryOwnershipMove(o *Ownership, to OwnershipState, err error) (moved, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	return o.moveLocked(to, err), false
}

// TestOwnershipTable checks the table against what the ownership promises:
// every state is listed and reached from joining; left is the end and
// every other state may reach it (Drain); refused goes nowhere else;
// draining never becomes member again; nothing goes back to draining but
// from member.
func TestOwnershipTable(t *testing.T) {
	if len(ownershipMoves) != len(ownershipStates) {
		t.Errorf("ownershipMoves has %d states; want the %d of ownershipStates", len(ownershipMoves), len(ownershipStates))
	}
	for _, from := range ownershipStates {
		moves, ok := ownershipMoves[from]
		if !ok {
			t.Errorf("%s has no row in ownershipMoves", from)
		}
		if from != StateLeft && !slices.Contains(moves, StateLeft) {
			t.Errorf("%s moves to %v; a drain must be able to end it", from, moves)
		}
		if slices.Contains(moves, from) {
			t.Errorf("%s moves to %v; staying is not a move", from, moves)
		}
		if from != StateMember && slices.Contains(moves, StateDraining) {
			t.Errorf("%s moves to %v; only a member drains", from, moves)
		}
	}
	if m := ownershipMoves[StateLeft]; len(m) != 0 {
		t.Errorf("left moves to %v; want nowhere", m)
	}
	if m := ownershipMoves[StateRefused]; !slices.Equal(m, []OwnershipState{StateLeft}) {
		t.Errorf("refused moves to %v; want [left]", m)
	}
	if slices.Contains(ownershipMoves[StateDraining], StateMember) {
		t.Errorf("draining moves to member; a draining node never joins again")
	}
	reached := map[OwnershipState]bool{StateJoining: true}
	for range ownershipStates {
		for _, st := range ownershipStates {
			if reached[st] {
				for _, to := range ownershipMoves[st] {
					reached[to] = true
				}
			}
		}
	}
	for _, st := range ownershipStates {
		if !reached[st] {
			t.Errorf("%s is never reached from joining", st)
		}
	}
}
