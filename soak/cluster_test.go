package soak

import (
	"context"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A three-member cluster of child processes keeps serving with its leader
// killed (a new one is elected) and with a member partitioned from the
// others; the partitioned member then leads nothing, and each comes back.
func TestEtcdCluster(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(exe, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	// A write in flight when the leader goes fails ("request timed out,
	// possibly due to previous leader failure"): the client does not
	// retry it, a caller does (shardfs's renewals retry every TTL/10).
	put := func(what string) {
		t.Helper()
		waitFor(t, "put "+what, func() error {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := cli.Put(pctx, "k", what)
			return err
		})
	}
	put("start")
	leader, err := c.Leader(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	put("leader killed")
	next, err := c.Leader(ctx, cli)
	if err != nil || next == leader {
		t.Fatalf("leader after killing %s: %v, %v; want another", leader.name, next, err)
	}
	if err := leader.Start(ctx); err != nil {
		t.Fatalf("restart of %s: %v", leader.name, err)
	}
	part := c.Members[0]
	if part == next {
		part = c.Members[1]
	}
	c.Partition(part)
	put("member partitioned")
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The cut member hears no leader within a few election timeouts.
	for {
		st, err := cli.Status(sctx, part.Endpoint)
		if err != nil || st.Leader == 0 {
			break
		}
		if sctx.Err() != nil {
			t.Fatalf("%s still follows leader %x while partitioned", part.name, st.Leader)
		}
		select {
		case <-sctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := c.Heal(part); err != nil {
		t.Fatal(err)
	}
	put("healed")
}
