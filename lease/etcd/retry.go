package etcd

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// noLeaderTries bounds the tries of one call refused with "no leader":
// the client's balancer sends each try to the next endpoint, so with
// three or five members one of the first few reaches a member that has a
// leader. While none has (an election is on) the call fails after a
// fraction of a second, and its caller's own retry (a resync, a join
// again) comes after the election.
const noLeaderTries = 8

// noLeaderPause spaces the tries after the first round over the
// endpoints, so that a cluster without any leader is asked a few times
// during its election rather than in a spin.
const noLeaderPause = 50 * time.Millisecond

// leaderKV retries a call that a member refused because it has no leader
// (clientv3.WithRequireLeader: a member cut off from the others, or one
// that has not heard of the new leader yet). The refusal comes before the
// request is processed, so retrying a write is safe; etcd's own client
// retries only reads, and a transaction that writes failed at once
// although two members could have served it (attack22 F1).
type leaderKV struct {
	clientv3.KV
	endpoints int
}

// RequireLeader returns c's KV with every Get and Txn under
// clientv3.WithRequireLeader and retried on another endpoint when a member
// refuses it for want of a leader: for the session store and the identify
// pacer, whose reads a member cut off from the others would otherwise hold
// until their deadline (a snapshot load held 5 s at TTL 3 s outlasted the
// grant it was for).
func RequireLeader(c *clientv3.Client) clientv3.KV {
	return leaderKV{c, len(c.Endpoints())}
}

func (k leaderKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	var r *clientv3.GetResponse
	err := k.retry(ctx, func() (err error) {
		r, err = k.KV.Get(ctx, key, opts...)
		return err
	})
	return r, err
}

func (k leaderKV) Txn(ctx context.Context) clientv3.Txn {
	ctx = clientv3.WithRequireLeader(ctx)
	return &leaderTxn{Txn: k.KV.Txn(ctx), ctx: ctx, kv: k}
}

// retry calls f until it is not refused for want of a leader, at most
// noLeaderTries times, pausing once every endpoint was tried.
func (k leaderKV) retry(ctx context.Context, f func() error) error {
	for i := 1; ; i++ {
		err := f()
		if !errors.Is(err, rpctypes.ErrNoLeader) || i >= noLeaderTries {
			return err
		}
		if i%max(k.endpoints, 1) == 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(noLeaderPause):
			}
		} else if ctx.Err() != nil {
			return err
		}
	}
}

// leaderTxn is a Txn whose Commit is retried by leaderKV.retry; the
// comparisons and operations are built once, so every try is the same
// request.
type leaderTxn struct {
	clientv3.Txn
	ctx context.Context
	kv  leaderKV
}

func (t *leaderTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *leaderTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *leaderTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *leaderTxn) Commit() (*clientv3.TxnResponse, error) {
	var r *clientv3.TxnResponse
	err := t.kv.retry(t.ctx, func() (err error) {
		r, err = t.Txn.Commit()
		return err
	})
	return r, err
}
