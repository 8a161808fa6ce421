package etcd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
	"github.com/shardfs/shardfs/soak"
)

// soleOwner reads the shard key's history: a key this node created again
// after its own was deleted, with no put by anyone in between, proves it
// was the sole owner; a put by another node in between, or a history
// compacted past the old generation, proves nothing.
func TestSoleOwner(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 30*time.Second)
	plan := Plan{Flavor: "discord", Total: 4}
	m, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: plan, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o, err := NewOwnership(OwnershipConfig{Client: cli, Bot: "b", Node: "a", Plan: plan, Shards: newRecShards(), Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	put := func(id int, node string) int64 {
		t.Helper()
		r, err := cli.Put(ctx, m.ShardKey(id), node)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	del := func(id int) int64 {
		t.Helper()
		r, err := cli.Delete(ctx, m.ShardKey(id))
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	prev := put(0, "a")
	del(0)
	put(3, "a") // another key's events do not count
	gen := put(0, "a")
	if !o.soleOwner(ctx, m, 0, prev, gen) {
		t.Error("soleOwner: a's key expired and a created it again; want proved")
	}
	prev = put(1, "a")
	del(1)
	put(1, "b")
	del(1)
	gen = put(1, "a")
	if o.soleOwner(ctx, m, 1, prev, gen) {
		t.Error("soleOwner: b created the key in between; want not proved")
	}
	prev = put(2, "a")
	del(2)
	gen = put(2, "a")
	if _, err := cli.Compact(ctx, gen); err != nil {
		t.Fatal(err)
	}
	if o.soleOwner(ctx, m, 2, prev, gen) {
		t.Error("soleOwner over a compacted history: want not proved")
	}
}

// An etcd outage costs no identify when nobody else took the shards
// (issue 22, item 8): a lone node owns 16 shards; etcd, a child process,
// is killed for 2 × TTL: the node fences itself (every shard stopped by
// an expired grant, 16 fencing stops); etcd restarts on its data; the
// node revokes its old lease, joins again and acquires the 16 shards at
// new generations, each grant marked Continues (etcd's history shows no
// other owner), so the core resumes each shard's own session.
func TestOwnershipEtcdOutageContinues(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e, err := soak.NewEtcd(exe, filepath.Join(t.TempDir(), "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Kill)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const total, ttl = 16, 3 * time.Second
	shards := newRecShards()
	log, _ := testLog(t)
	o, err := NewOwnership(OwnershipConfig{Client: cli, Bot: "b", Node: "a", Plan: Plan{Flavor: "discord", Total: total}, TTL: ttl, MaxConcurrency: 1, Shards: shards, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitForLong(t, time.Minute, "a to own 16 shards", func() bool { return len(shards.owned(time.Now())) == total })
	before := map[int]uint64{}
	for id, g := range shards.owned(time.Now()) {
		before[id] = g
	}
	e.Kill()
	waitForLong(t, time.Minute, "the fencing stops", func() bool { return o.Status().FencingStops == total })
	if n := len(shards.owned(time.Now())); n != 0 {
		t.Fatalf("%d shards still granted after the fence", n)
	}
	<-time.After(2 * ttl) // etcd stays down for 2 × TTL: the outage is the test's subject, not a wait for a state
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitForLong(t, time.Minute, "a to own 16 shards again", func() bool { return len(shards.owned(time.Now())) == total })
	shards.mu.Lock()
	defer shards.mu.Unlock()
	for id := range total {
		g := shards.grants[id]
		if !g.Continues || g.Generation <= before[id] {
			t.Errorf("shard %d after the outage: grant %+v; want a new generation (was %d), Continues", id, g, before[id])
		}
	}
}
