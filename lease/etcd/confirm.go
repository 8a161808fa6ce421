package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/core"
)

// Confirm asks etcd, in one linearizable read that starts now, whether
// this membership's lease still holds the node's keys: members/<node>
// (or, once Leave deleted it, one of the node's shard keys) is attached
// to the lease. etcd deletes a lease's keys when it expires it, and
// another node can own a shard only after its key is gone, so a yes
// means that no other node owned this node's shards when etcd answered:
// what the node read before Confirm was called may be delivered (the
// core's confirmed delivery, core.Confirmer). A no ends the membership
// (ErrLeaseLost, as a failed renewal would) and wraps both
// core.ErrUnconfirmed and ErrLeaseLost; an error etcd gave, or no answer
// within a third of the TTL, wraps neither.
//
// It is what a VM frozen by its hypervisor needs: its clocks stood still,
// so its deadline has not passed, but etcd's did.
func (m *Member) Confirm(ctx context.Context) error {
	m.mu.Lock()
	err := m.err
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %w", core.ErrUnconfirmed, err)
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), m.ttl/3)
	defer cancel()
	held, err := m.holdsKeys(ctx)
	if err != nil {
		return fmt.Errorf("etcd: confirm lease %x: %w", int64(m.id), err)
	}
	if held {
		return nil
	}
	m.mu.Lock()
	m.loseLocked(fmt.Errorf("%w: etcd holds none of this node's keys on lease %x (a confirmation found it expired)", ErrLeaseLost, int64(m.id)))
	err = m.err
	m.mu.Unlock()
	return fmt.Errorf("%w: %w", core.ErrUnconfirmed, err)
}

// holdsKeys is Confirm's read. A Get of etcd's default (linearizable)
// consistency goes through the leader's ReadIndex, so a partitioned or
// deposed member cannot answer it from its stale copy.
func (m *Member) holdsKeys(ctx context.Context) (bool, error) {
	if !m.left.Load() {
		r, err := m.kv.Get(ctx, m.prefix+"members/"+m.node)
		if err != nil {
			return false, err
		}
		if len(r.Kvs) == 1 && clientv3.LeaseID(r.Kvs[0].Lease) == m.id {
			return true, nil
		}
		if !m.left.Load() {
			return false, nil
		}
		// Leave began after the check above and its delete reached
		// etcd before this Get: the member key is gone by the drain,
		// not by an expiry (CI saw a drain lose its shards this way).
		// Leave sets left before its delete, so a Get that misses the
		// key finds left set; the shard keys decide.
	}
	// A draining node left the members: its shard keys still on the lease
	// say the same (a few, for the length of a drain).
	r, err := m.kv.Get(ctx, m.prefix+"shards/", clientv3.WithPrefix())
	if err != nil {
		return false, err
	}
	for _, kv := range r.Kvs {
		if clientv3.LeaseID(kv.Lease) == m.id {
			return true, nil
		}
	}
	return false, nil
}

// Confirm forwards to the current membership (Member.Confirm); with none,
// it wraps core.ErrUnconfirmed: a node between memberships owns nothing.
func (o *Ownership) Confirm(ctx context.Context) error {
	o.mu.Lock()
	m := o.member
	o.mu.Unlock()
	if m == nil {
		return fmt.Errorf("%w: node %s is not a member now: %w", core.ErrUnconfirmed, o.cfg.Node, ErrLeaseLost)
	}
	return m.Confirm(ctx)
}

var _ core.Confirmer = (*Ownership)(nil)
