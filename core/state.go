package core

// State is a shard's lifecycle state. Its String form is the word users see
// in the state file.
type State uint8

// The six states of DESIGN.md section 2.
const (
	Assigned State = iota // owned by this node, not started yet
	Starting              // connecting, waiting for an identify slot, identifying or resuming
	Ready                 // a session is live
	Backoff               // a transient failure happened; waiting for the reconnect deadline
	Fatal                 // retrying cannot fix it; only "retry" leaves it
	Stopped               // stopped by the operator, by lease expiry or by shutdown
	numStates
)

var stateNames = [numStates]string{"ASSIGNED", "STARTING", "READY", "BACKOFF", "FATAL", "STOPPED"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "UNKNOWN"
}

// StopReason says why a shard is STOPPED.
type StopReason uint8

// Why a shard stopped.
const (
	NotStopped StopReason = iota
	StoppedByOperator
	StoppedByLease
	StoppedByShutdown
	// StoppedByLeaseLost: the node's ownership lease (etcd) passed its
	// fencing deadline; another node may own the shard now.
	StoppedByLeaseLost
	// StoppedByMove: a planned handover (Scheduler.Handover) stopped the shard
	// and saved its session for the next owner.
	StoppedByMove
	// StoppedNotOwned: the shard is a candidate of this node that another
	// node owns, or nobody yet.
	StoppedNotOwned
)

var stopReasonNames = [...]string{"", "operator", "lease expired", "shutdown", "lease lost", "moved", "not owned"}

func (r StopReason) String() string { return stopReasonNames[r] }

// byLease reports whether the lease, not the operator or a shutdown,
// stopped the shard: a grant can start it again.
func (r StopReason) byLease() bool {
	return r == StoppedByLease || r == StoppedByLeaseLost || r == StoppedByMove || r == StoppedNotOwned
}
