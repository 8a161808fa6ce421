package core

import (
	"fmt"
	"time"

	"github.com/shardfs/shardfs/moveset"
)

// stateSet is a set of States, one bit each.
type stateSet = moveset.Set[State]

func states(ss ...State) stateSet { return moveset.Of(ss...) }

// stateMoves lists, for each state, the states a shard may move to: the
// whole lifecycle of DESIGN.md section 2 in one place. Staying in a state
// (a second READY on a live session, a reset in BACKOFF, op 9 while
// STARTING) is not a move. Nothing goes back to ASSIGNED, and only
// STARTING and READY have a connection, so only they reach READY or
// FATAL (a failure the transport reports).
var stateMoves = [numStates]stateSet{
	// Start, or a stop or lease expiry before it; BACKOFF when a panic
	// interrupts the first start.
	Assigned: states(Starting, Backoff, Stopped),
	Starting: states(Ready, Backoff, Fatal, Stopped),
	// To STARTING: op 9 on the open socket (Fluxer), or the operator's
	// identify, which starts a new session without a failure.
	Ready: states(Starting, Backoff, Fatal, Stopped),
	// The reconnect deadline, or the operator's identify, starts it again.
	Backoff: states(Starting, Stopped),
	// Only the operator's retry leaves FATAL: to STARTING, or to STOPPED
	// when the lease (or Close) forbids the start.
	Fatal:   states(Starting, Stopped),
	Stopped: states(Starting),
}

// moveLocked moves the shard to state to, noting when it changed; moving
// to the state it is in does nothing. A session that stayed READY for
// ReadyReset starts the failure count again, however it ends.
//
// A move stateMoves does not list is a bug in the caller and panics, as a
// connection's phase does in the gateway client: the shard's own panic
// handling (unlock) turns it into a transient failure of that shard
// alone, logged with its stack in its events, so the refusal is seen in
// production as it is in tests. The moves that handling makes (to
// BACKOFF, or STOPPED after Close, from any state but FATAL and STOPPED)
// are listed, so it cannot panic again.
func (s *shard) moveLocked(to State, now time.Time) {
	from := s.state
	if from == to {
		return
	}
	if f := s.node.onMove; f != nil {
		f(s.id, from, to)
	}
	if !stateMoves[from].Has(to) {
		panic(fmt.Sprintf("core: shard %d cannot move from %v to %v", s.id, from, to))
	}
	if from == Ready {
		s.recovery = true
		if now.Sub(s.readySince) >= ReadyReset {
			s.failures = 0
		}
	}
	s.state, s.since = to, now
}
