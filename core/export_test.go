package core

// SetOnMove makes every move a shard makes or attempts, listed or not,
// call f under that shard's lock; set it before Start. f must not call the
// Scheduler, and must not panic: the core would take the panic for the
// shard's own.
func (n *Scheduler) SetOnMove(f func(shard int, from, to State)) { n.onMove = f }

// MoveListed reports whether the lifecycle table lists the move.
func MoveListed(from, to State) bool { return stateMoves[from].Has(to) }

// NumStates is how many lifecycle states there are.
const NumStates = numStates

// SetOnWait makes every Confirm call f once it has joined its check;
// set it before the first Confirm.
func (c *Confirmations) SetOnWait(f func()) { c.onWait = f }
