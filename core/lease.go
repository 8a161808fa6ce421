package core

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// Lease is the backend that grants shards the right to connect. Operator
// lease commands go to it and the grants it returns are applied at once; a
// backend that learns of changes by itself (etcd) calls Scheduler.SetLease.
type Lease interface {
	// Arm arms or renews the leases of shards for d.
	Arm(shards []int, d time.Duration) ([]LeaseGrant, error)
	// Off turns enforcement off for shards.
	Off(shards []int) ([]LeaseGrant, error)
}

// LeaseGrant is one shard's lease as the core enforces it.
type LeaseGrant struct {
	Shard int
	// Deadline is when the lease expires; zero disables enforcement. The
	// core keeps it on the monotonic clock from the moment the grant is
	// applied (Deadline minus the clock's Now), so a step of the wall
	// clock after that does not move it.
	Deadline time.Time
	// Generation is the fencing token: it grows each time the lease is armed
	// after it expired or was off. For an ownership grant it is the
	// generation of the shard's key (etcd: its CreateRevision); 0 means
	// the node does not own the shard.
	Generation uint64
	// Owner marks a grant of ownership across nodes (lease/etcd): its
	// expiry stops the shard with reason "lease lost", generation 0 with
	// "not owned", and a shard granted a new generation loads its snapshot
	// from the session store again before it starts, so that it resumes
	// the session the previous owner handed over.
	Owner bool
	// Continues, on an ownership grant of a new generation, says that the
	// ownership layer proved that no other node owned the shard since
	// this node last held it: the shard stopped by "lease lost" keeps the
	// session it holds in memory and resumes it, rather than load a
	// snapshot (an etcd outage then costs no identify; lease/etcd's doc
	// has the argument).
	Continues bool
}

// NotOwned is the grant of a candidate shard another node owns: it keeps
// the shard STOPPED (reason "not owned") until a grant of ownership.
func NotOwned(shard int) LeaseGrant {
	return LeaseGrant{Shard: shard, Owner: true, Deadline: time.Unix(0, 0)}
}

// Fence is the "may write until" deadline of a shard's connections, on the
// monotonic clock (clock.Mono: CLOCK_BOOTTIME, which counts a suspend),
// with the grant's wall-clock deadline as a second, pessimistic bound. The
// transport checks it before every write it makes on the gateway socket
// (identify, resume, heartbeat, command, the close frame) and, past it,
// drops the connection without writing; the core and the transport check
// it before a received event is counted or delivered (dispatch, events,
// the relay), so that a node woken from a pause delivers nothing it
// received for a shard it may no longer own.
//
// Why it exists beside the lease timer: after a pause (SIGSTOP, a VM
// freeze) every overdue timer fires at once and in any order, so a
// connection's heartbeat timer, or its reader, may run before the shard's
// lease timer has stopped it. The fence is checked against the clock at
// the moment of the write or the delivery, so no timer order can let a
// frame out, or an event in, past the deadline.
//
// Why the wall clock too: the boot clock is the node's own, and etcd
// counts the lease on its leader's; a wall clock that stepped forward
// past the deadline (NTP after a long stop, an operator) may be the only
// sign that time passed. Either clock past its deadline closes the fence;
// the next renewal opens it again (same generation), so a wall step costs
// a reconnect that resumes, never an identify.
//
// The core gives each connection the fence of the grant it started under:
// renewals of the same generation move it, a new generation gets a new
// fence, and a handover freezes it.
type Fence struct {
	until atomic.Int64 // monotonic nanoseconds; math.MaxInt64: no limit
	wall  atomic.Int64 // Unix nanoseconds of the wall deadline; math.MaxInt64: none
}

// NewFence returns a fence that allows writes until the monotonic reading
// until (math.MaxInt64: always), with no wall-clock bound. The core makes
// the fences of its shards; this is for transports' tests.
func NewFence(until time.Duration) *Fence { return newFence(until, time.Time{}) }

func newFence(until time.Duration, wall time.Time) *Fence {
	f := &Fence{}
	f.set(until, wall)
	return f
}

// Allows reports whether a write may go out at monotonic time now,
// checking the monotonic deadline only. A nil Fence allows every write
// (no lease enforced).
func (f *Fence) Allows(now time.Duration) bool {
	return f == nil || int64(now) < f.until.Load()
}

// Open reports whether c's clocks are both before their deadlines: the
// monotonic reading (clock.Mono) and the wall clock (c.Now). A nil Fence
// is always open.
func (f *Fence) Open(c clock.Clock) bool {
	if f == nil {
		return true
	}
	return f.Allows(clock.Mono(c)) && c.Now().UnixNano() < f.wall.Load()
}

// Until returns the monotonic deadline, and false when there is none.
func (f *Fence) Until() (time.Duration, bool) {
	if f == nil {
		return 0, false
	}
	u := f.until.Load()
	return time.Duration(u), u != math.MaxInt64
}

// set moves the fence to the monotonic reading until and the wall time
// wall (zero: no wall bound, as with no monotonic bound).
func (f *Fence) set(until time.Duration, wall time.Time) {
	w := int64(math.MaxInt64)
	if !wall.IsZero() && until != math.MaxInt64 {
		w = wall.UnixNano()
	}
	f.wall.Store(w)
	f.until.Store(int64(until))
}
