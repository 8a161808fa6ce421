package core

import "time"

// Lease is the backend that grants shards the right to connect. Operator
// lease commands go to it and the grants it returns are applied at once; a
// backend that learns of changes by itself (etcd) calls Node.SetLease.
type Lease interface {
	// Arm arms or renews the leases of shards for d.
	Arm(shards []int, d time.Duration) ([]LeaseGrant, error)
	// Off turns enforcement off for shards.
	Off(shards []int) ([]LeaseGrant, error)
}

// LeaseGrant is one shard's lease as the core enforces it.
type LeaseGrant struct {
	Shard int
	// Deadline is when the lease expires; zero disables enforcement.
	Deadline time.Time
	// Generation is the fencing token: it grows each time the lease is armed
	// after it expired or was off.
	Generation uint64
}
