package reshard

import (
	"fmt"

	"github.com/shardfs/shardfs/moveset"
)

// State is where a node's moves are, as /reshard's state line shows it.
// Every change goes through Mover.moveLocked, under the mover's lock, and
// must be one that stateMoves lists.
type State uint8

const (
	Idle     State = iota // no move since the node started
	Checking              // a move checks the new total, the budget and the rate
	Starting              // the new plan runs beside the old one until every new shard is READY
	Switched              // the last move switched: the tree shows its plan
	Refused               // the last move was refused before it started anything
	Aborted               // the last move ended before the switch; the old plan serves
	numStates
)

var stateNames = [numStates]string{"idle", "checking", "starting", "switched", "refused", "aborted"}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// running reports whether a move is under way: a further move is refused.
func (s State) running() bool { return s == Checking || s == Starting }

// stateSet is a set of States, one bit each.
type stateSet = moveset.Set[State]

func states(ss ...State) stateSet { return moveset.Of(ss...) }

// settled is where a node that runs no move may go: a move starts
// (checking), or is refused at once (a refusal known when it is asked
// for, or a 4011 that the node does not answer with a move).
var settled = states(Checking, Refused)

// stateMoves lists, for each state, the states it may move to: the whole
// life of a node's moves in one place. A move runs checking → starting →
// switched or aborted, or is refused while checking; then the next one
// may start. Nothing moves a running move back to idle, and nothing
// refuses a move once its new plan runs (it aborts).
var stateMoves = [numStates]stateSet{
	Idle:     settled,
	Checking: states(Starting, Refused),
	Starting: states(Switched, Aborted),
	Switched: settled,
	Refused:  settled,
	Aborted:  settled,
}
