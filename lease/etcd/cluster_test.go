package etcd

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/soak"
)

// A fault of one etcd member leaves etcd a quorum, so it must cost no
// identify at the short TTL of 3 s (issue 22, "A real cluster"; attack22
// F1: a member partition, a leader partition or a leader kill fenced
// nodes and cost identifies): nodes a and b share 8 shards over a
// three-member cluster of child processes; a follower is partitioned
// from the others, then the leader, then the leader is killed, each for
// 2 × TTL. No shard may change node, nor generation unless the grant of
// the new one says the session continues. Across a follower's
// partition two members with a leader stay reachable, so no node may lose
// its membership either (no fencing stop). A leader partitioned or killed
// may cost one: no member has a leader until the others elect one, one to
// two election timeouts later (1 s each by default), while the deadline
// falls 2 s after the last answered renewal's send, up to TTL/3 before
// the fault; the node then joins again with its keys (Config.Replaces),
// and the core resumes its sessions (doc/fleet.md).
func TestOwnershipClusterFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three etcd members as child processes for about a minute")
	}
	c, err := soak.NewCluster(soak.BuildEtcd(t), t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const total, ttl = 8, 3 * time.Second
	rigs, owned, placed := twoNodes(t, cli, total, ttl)
	waitForLong(t, time.Minute, "a and b to own their shares", placed)
	fenced := func() uint64 { return rigs[0].o.Status().FencingStops + rigs[1].o.Status().FencingStops }
	ctx := t.Context()
	leader := func() *soak.Etcd {
		t.Helper()
		var l *soak.Etcd
		waitForLong(t, time.Minute, "an etcd leader", func() bool {
			var err error
			l, err = c.Leader(ctx, cli)
			return err == nil
		})
		return l
	}
	faults := []struct {
		name   string
		member func() *soak.Etcd
		cut    func(*soak.Etcd)
		repair func(*soak.Etcd) error
	}{
		{"follower partition", func() *soak.Etcd {
			l := leader()
			for _, m := range c.Members {
				if m != l {
					return m
				}
			}
			panic("one member")
		}, c.Partition, c.Heal},
		{"leader partition", leader, c.Partition, c.Heal},
		{"leader kill", leader, (*soak.Etcd).Kill, func(e *soak.Etcd) error { return e.Start(context.Background()) }},
	}
	for _, f := range faults {
		beforeWho, beforeGen := owned()
		fencedBefore := fenced()
		m := f.member()
		f.cut(m)
		// Held for 2 × TTL: the fault is the subject, not a wait for a state.
		<-time.After(2 * ttl)
		who, gens := owned()
		lost := fenced() - fencedBefore
		if err := f.repair(m); err != nil {
			t.Fatalf("%s: repair: %v", f.name, err)
		}
		t.Logf("%s: %d fencing stops", f.name, lost)
		if f.name == "follower partition" {
			if lost != 0 {
				t.Errorf("%s: %d fencing stops; want none (two members with a leader were reachable)", f.name, lost)
			}
			for id := range total {
				if who[id] != beforeWho[id] || gens[id] != beforeGen[id] {
					t.Errorf("%s: shard %d on %q at generation %d at the fault's end; was on %q at %d", f.name, id, who[id], gens[id], beforeWho[id], beforeGen[id])
				}
			}
		}
		waitForLong(t, time.Minute, fmt.Sprintf("a and b to own their shares after the %s", f.name), placed)
		// No identify: every shard is back on its node, at its generation
		// (the keys were kept), or at a new one marked Continues (the key
		// went, but nobody else held it in between).
		afterWho, afterGen := owned()
		for id := range total {
			if afterWho[id] != beforeWho[id] {
				t.Errorf("%s: shard %d moved from %s to %s", f.name, id, beforeWho[id], afterWho[id])
				continue
			}
			if afterGen[id] == beforeGen[id] {
				continue
			}
			r := rigs[map[string]int{"a": 0, "b": 1}[afterWho[id]]]
			r.shards.mu.Lock()
			first := r.shards.first[[2]uint64{uint64(id), afterGen[id]}]
			r.shards.mu.Unlock()
			if !first.Continues {
				t.Errorf("%s: shard %d granted generation %d (was %d) without Continues: a new session", f.name, id, afterGen[id], beforeGen[id])
			}
		}
	}
}
