package etcd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/internal/poll"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// A member whose clock stands still (a VM frozen by its hypervisor: the
// fake clock is never advanced) still thinks its lease runs; etcd expired
// it and another node took its shard. Its Confirm says so: ErrUnconfirmed,
// and the membership ends.
func TestConfirmFrozenMember(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, time.Minute)
	a, _, _ := join(t, cli, "a", 2*time.Second)
	if _, err := a.Acquire(ctx, 3); err != nil {
		t.Fatalf("a.Acquire(3): %v", err)
	}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("a.Confirm with its lease alive = %v; want nil", err)
	}
	b, _, _ := join(t, cli, "b", 10*time.Second)
	if err := poll.Until(ctx, "etcd expires a's lease and b acquires shard 3", time.Minute, 100*time.Millisecond, func() error {
		_, err := b.Acquire(ctx, 3)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if r := a.Remaining(); r <= 0 {
		t.Fatalf("a.Remaining() = %v on a clock that stood still; want > 0 (the frozen node's own view)", r)
	}
	err := a.Confirm(ctx)
	if !errors.Is(err, core.ErrUnconfirmed) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a.Confirm after etcd expired its lease = %v; want ErrUnconfirmed and ErrLeaseLost", err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("a's membership did not end after a failed confirmation")
	}
	if err := a.Confirm(ctx); !errors.Is(err, core.ErrUnconfirmed) {
		t.Fatalf("a.Confirm after the loss = %v; want ErrUnconfirmed at once", err)
	}
	if err := b.Confirm(ctx); err != nil {
		t.Fatalf("b.Confirm = %v; want nil", err)
	}
}

// A draining member deleted members/<node> but its shard keys hold its
// lease: Confirm still says yes; with nothing left on the lease, no.
func TestConfirmAfterLeave(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, time.Minute)
	a, _, _ := join(t, cli, "a", 10*time.Second)
	gen, err := a.Acquire(ctx, 5)
	if err != nil {
		t.Fatalf("a.Acquire(5): %v", err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatalf("a.Leave: %v", err)
	}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("a.Confirm after Leave, shard 5 still held = %v; want nil", err)
	}
	if err := a.Release(ctx, 5, gen); err != nil {
		t.Fatalf("a.Release(5): %v", err)
	}
	if err := a.Confirm(ctx); !errors.Is(err, core.ErrUnconfirmed) {
		t.Fatalf("a.Confirm with no key left on the lease = %v; want ErrUnconfirmed", err)
	}
}

// With etcd down, Confirm cannot tell: its error is not ErrUnconfirmed,
// and the membership goes on (its deadline decides).
func TestConfirmEtcdDown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a, _, _ := join(t, cli, "a", 3*time.Second)
	srv.Stop()
	err := a.Confirm(context.Background())
	if err == nil || errors.Is(err, core.ErrUnconfirmed) {
		t.Fatalf("a.Confirm with etcd down = %v; want an error that is not ErrUnconfirmed", err)
	}
	if a.Err() != nil {
		t.Fatalf("a.Err() after an unanswered confirmation = %v; want nil", a.Err())
	}
	t.Logf("confirm with etcd down: %v", err)
}

// getHook is a KV that runs before ahead of its first Get.
type getHook struct {
	clientv3.KV
	before func()
	once   sync.Once
}

func (g *getHook) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	g.once.Do(g.before)
	return g.KV.Get(ctx, key, opts...)
}

// A drain's Leave that lands between Confirm's look at "left" and its
// read of members/<node> is not a lost lease: the shard keys still on the
// lease say yes (CI saw a drain lose 4 shards, and a message, this way).
func TestConfirmRacingLeave(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, time.Minute)
	a, _, _ := join(t, cli, "a", 10*time.Second)
	if _, err := a.Acquire(ctx, 5); err != nil {
		t.Fatalf("a.Acquire(5): %v", err)
	}
	a.kv = &getHook{KV: a.kv, before: func() {
		if err := a.Leave(ctx); err != nil {
			t.Errorf("a.Leave: %v", err)
		}
	}}
	if err := a.Confirm(ctx); err != nil {
		t.Fatalf("a.Confirm with Leave racing it, shard 5 still held = %v; want nil", err)
	}
	if err := a.Err(); err != nil {
		t.Fatalf("the membership after the race: %v; want it going on", err)
	}
}
