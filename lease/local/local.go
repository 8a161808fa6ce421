// Package local is the embedded default lease: armed and renewed by the
// operator's "lease DURATION", turned off by "lease off", expiring on the
// injected clock.
//
// It holds no goroutine: the core enforces each deadline with its own timer,
// and this package only decides deadlines and generations. A shard's
// generation grows each time its lease is armed while expired or off, so it
// works as a fencing token; a renewal before expiry keeps it.
package local

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// OperatorLease is the local lease of one node's shards. Every shard starts with
// its lease off (enforcement disabled), generation 0.
type OperatorLease struct {
	clock clock.Clock

	mu     sync.Mutex
	grants map[int]core.LeaseGrant
}

var _ core.Lease = (*OperatorLease)(nil)

// New returns a lease reading time from c (nil = real time).
func New(c clock.Clock) *OperatorLease {
	return &OperatorLease{clock: clock.Or(c), grants: map[int]core.LeaseGrant{}}
}

// Arm arms or renews the leases of shards for d.
func (l *OperatorLease) Arm(shards []int, d time.Duration) ([]core.LeaseGrant, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	out := make([]core.LeaseGrant, len(shards))
	for i, id := range shards {
		g := l.grants[id]
		if g.Deadline.IsZero() || !now.Before(g.Deadline) {
			g.Generation++
		}
		g.Shard, g.Deadline = id, now.Add(d)
		l.grants[id] = g
		out[i] = g
	}
	return out, nil
}

// Off turns enforcement off for shards.
func (l *OperatorLease) Off(shards []int) ([]core.LeaseGrant, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]core.LeaseGrant, len(shards))
	for i, id := range shards {
		g := l.grants[id]
		g.Shard, g.Deadline = id, time.Time{}
		l.grants[id] = g
		out[i] = g
	}
	return out, nil
}

// Summary describes the leases of a set of shards for the lease file.
type Summary struct {
	Backend string
	// Armed counts shards whose lease is armed (expired or not); Expired
	// counts those whose deadline has passed.
	Armed, Expired int
	// Generation is the largest generation among the shards.
	Generation uint64
	// Deadline is the earliest deadline of an armed, unexpired lease.
	Deadline time.Time
}

// Summarize summarizes the leases of shards.
func (l *OperatorLease) Summarize(shards []int) Summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	s := Summary{Backend: "local"}
	for _, id := range shards {
		g := l.grants[id]
		s.Generation = max(s.Generation, g.Generation)
		if g.Deadline.IsZero() {
			continue
		}
		s.Armed++
		if !now.Before(g.Deadline) {
			s.Expired++
		} else if s.Deadline.IsZero() || g.Deadline.Before(s.Deadline) {
			s.Deadline = g.Deadline
		}
	}
	return s
}
