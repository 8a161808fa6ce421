package supervisor

import (
	"fmt"
	"slices"
)

// childStates lists every state of a child, in the order of its life.
var childStates = []State{Idle, Starting, Running, Restarting, Stopping, Hung, Closed, Failed}

// childMoves lists, for each state of a child, the states it may move to:
// a child's whole life in one place. Staying in a state is no move.
// Closed and failed are the ends; only a child with a process (starting,
// running, stopping, hung) fails, and only one without (idle, restarting)
// is closed without being stopped or killed first.
var childMoves = map[State][]State{
	// Start, or Close before it.
	Idle: {Starting, Closed},
	// Restarting or failed: it exited before it was ready, or could not
	// be launched at all.
	Starting: {Running, Stopping, Restarting, Failed},
	Running:  {Stopping, Restarting, Failed, Hung},
	// The restart delay ran out (or the operator restarted it now), or
	// Close came first.
	Restarting: {Starting, Closed},
	// Its exit: started again (the operator's restart), closed, or, after
	// a stop for a failure (startup timeout, broken channel), handed to
	// the restart policy.
	Stopping: {Starting, Restarting, Failed, Closed},
	// Killed by the watchdog: its exit goes to the restart policy, or
	// closes it when the supervisor is closing.
	Hung:   {Restarting, Failed, Closed},
	Closed: nil,
	// The operator's restart ID: a fresh restart budget (its shards ran
	// nowhere meanwhile).
	Failed: {Starting},
}

// moveLocked moves c to state to; staying in its state does nothing. A
// move childMoves does not list is a bug in the caller and panics, as a
// gateway connection's phase does: a supervisor that lost track of a
// child could leave its process running, or never be done.
func (s *Supervisor) moveLocked(c *child, to State) {
	from := c.state
	if from == to {
		return
	}
	if f := s.onMove; f != nil {
		f(c.ID, from, to)
	}
	if !slices.Contains(childMoves[from], to) {
		panic(fmt.Sprintf("supervisor: child %s cannot move from %s to %s", c.ID, from, to))
	}
	c.state = to
}
