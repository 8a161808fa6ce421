package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// recShards records what the ownership layer tells the core.
type recShards struct {
	mu        sync.Mutex
	grants    map[int]core.LeaseGrant
	handovers map[int]int
	history   []string
}

func newRecShards() *recShards {
	return &recShards{grants: map[int]core.LeaseGrant{}, handovers: map[int]int{}}
}

func (r *recShards) SetLease(g core.LeaseGrant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.grants[g.Shard] = g
	r.history = append(r.history, fmt.Sprintf("grant %d gen %d", g.Shard, g.Generation))
}

func (r *recShards) Handover(id int) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handovers[id]++
	r.history = append(r.history, fmt.Sprintf("handover %d", id))
	return true, nil
}

// owned returns the shards granted a live generation (not yet expired on
// clk), by generation.
func (r *recShards) owned(now time.Time) map[int]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int]uint64{}
	for id, g := range r.grants {
		if g.Generation != 0 && g.Deadline.After(now) {
			out[id] = g.Generation
		}
	}
	return out
}

// waitFor polls cond at the process boundary of a real etcd, with a bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type ownRig struct {
	o      *Ownership
	shards *recShards
	clk    *clock.Fake
	log    *logBuf
	cancel context.CancelFunc
	done   chan error
}

func startOwnership(t *testing.T, cli *clientv3.Client, node string, plan Plan, mc int) *ownRig {
	t.Helper()
	log, buf := testLog(t)
	r := &ownRig{shards: newRecShards(), clk: clock.NewFake(), log: buf, done: make(chan error, 1)}
	o, err := NewOwnership(OwnershipConfig{Client: cli, Bot: "b", Node: node, Plan: plan, MaxConcurrency: mc,
		Shards: r.shards, Clock: r.clk, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r.o = o
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- o.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *ownRig) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
		r.cancel = nil
	}
}

// keys reads shards/<id> → node and generation.
func keys(t *testing.T, cli *clientv3.Client) map[int][2]string {
	t.Helper()
	r, err := cli.Get(etcdtest.Ctx(t, 5*time.Second), "/shardfs/b/shards/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][2]string{}
	for _, kv := range r.Kvs {
		var id int
		fmt.Sscanf(strings.TrimPrefix(string(kv.Key), "/shardfs/b/shards/"), "%d", &id)
		out[id] = [2]string{string(kv.Value), fmt.Sprint(kv.CreateRevision)}
	}
	return out
}

// A lone node acquires every shard and grants each its key's generation;
// a second node joins and the first hands it its rendezvous share by
// planned moves (handover, then release), paced; in the end every key is
// held by its rendezvous owner, granted to that node's core at the key's
// generation, and the tree files say so.
func TestOwnershipJoinMoves(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	plan := Plan{Flavor: "discord", Total: 16}
	a := startOwnership(t, cli, "a", plan, 4)
	waitFor(t, "a to own 16 shards", func() bool { return len(a.shards.owned(a.clk.Now())) == 16 })
	for id, k := range keys(t, cli) {
		if g := a.shards.owned(a.clk.Now())[id]; k[0] != "a" || fmt.Sprint(g) != k[1] {
			t.Fatalf("shard %d: key %v, grant generation %d", id, k, g)
		}
	}
	b := startOwnership(t, cli, "b", plan, 4)
	members := []string{"a", "b"}
	want := Placement("b", members, 16)
	// The pacer allows 4 moves per 5 s of a's fake clock: without a's
	// clock moving, only 4 may have moved.
	waitFor(t, "the first 4 moves", func() bool { return len(b.shards.owned(b.clk.Now())) == min(4, len(want)) })
	if got := len(b.shards.owned(b.clk.Now())); len(want) > 4 && got != 4 {
		t.Fatalf("b owns %d shards before a's pacing window passed; want 4", got)
	}
	for len(b.shards.owned(b.clk.Now())) < len(want) {
		a.clk.Advance(MoveWindow)
		n := len(b.shards.owned(b.clk.Now()))
		waitFor(t, "the next moves", func() bool { return len(b.shards.owned(b.clk.Now())) >= min(n+4, len(want)) })
	}
	waitFor(t, "a to own the rest", func() bool { return len(a.shards.owned(a.clk.Now())) == 16-len(want) })
	k := keys(t, cli)
	for id := range 16 {
		owner := Owner(id, members)
		if k[id][0] != owner {
			t.Fatalf("shard %d key held by %q; rendezvous says %q", id, k[id][0], owner)
		}
		rig := a
		if owner == "b" {
			rig = b
			a.shards.mu.Lock()
			if a.shards.handovers[id] != 1 || a.shards.grants[id].Generation != 0 {
				a.shards.mu.Unlock()
				t.Fatalf("moved shard %d: a handed over %d times, a's last grant %+v", id, a.shards.handovers[id], a.shards.grants[id])
			}
			a.shards.mu.Unlock()
		}
		if g := rig.shards.owned(rig.clk.Now())[id]; fmt.Sprint(g) != k[id][1] {
			t.Fatalf("shard %d: %s granted generation %d; key generation %s", id, owner, g, k[id][1])
		}
	}
	if st := a.o.Status(); st.Moves != uint64(len(want)) || st.State != StateMember || st.Owned != 16-len(want) {
		t.Fatalf("a's status %+v; want %d moves", st, len(want))
	}
	waitFor(t, "a's /members to show both", func() bool {
		return string(a.o.MembersText()) == fmt.Sprintf("a %d\nb %d\n", 16-len(want), len(want))
	})
	owners := strings.Split(strings.TrimSpace(string(b.o.OwnersText())), "\n")
	if len(owners) != 16 || !strings.HasPrefix(owners[0], "0 "+Owner(0, members)+" ") {
		t.Fatalf("/owners = %q", owners)
	}
	lease := string(a.o.LeaseText(a.clk.Now()))
	for _, want := range []string{"backend etcd\n", "node a\n", "state member\n", "ttl 10s\n", "remaining ", "deadline 20"} {
		if !strings.Contains(lease, want) {
			t.Fatalf("/lease lacks %q:\n%s", want, lease)
		}
	}
}

// Drain hands everything over and leaves: the other node ends up with
// every shard, the drained node's member key is gone, and it acquires
// nothing afterwards.
func TestOwnershipDrain(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	plan := Plan{Flavor: "discord", Total: 8}
	a := startOwnership(t, cli, "a", plan, 8)
	b := startOwnership(t, cli, "b", plan, 8)
	waitFor(t, "both to own their share", func() bool {
		return len(a.shards.owned(a.clk.Now()))+len(b.shards.owned(b.clk.Now())) == 8 && len(keys(t, cli)) == 8
	})
	if err := a.o.Drain(etcdtest.Ctx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to own all 8", func() bool { return len(b.shards.owned(b.clk.Now())) == 8 })
	if n := len(a.shards.owned(a.clk.Now())); n != 0 {
		t.Fatalf("a still owns %d shards after its drain", n)
	}
	if r, _ := cli.Get(etcdtest.Ctx(t, 5*time.Second), "/shardfs/b/members/a"); len(r.Kvs) != 0 {
		t.Fatal("a's member key outlived its drain")
	}
	if st := a.o.Status(); st.State != StateLeft {
		t.Fatalf("a's state %q; want left", st.State)
	}
	for id, k := range keys(t, cli) {
		if k[0] != "b" {
			t.Fatalf("shard %d held by %q after the drain", id, k[0])
		}
	}
}

// etcd unreachable at start: the node waits, owns nothing, and says why;
// a plan key of garbage or another plan refuses the node with both plans
// named.
func TestOwnershipWaitsAndRefuses(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	dead, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	w := startOwnership(t, dead, "w", Plan{Flavor: "discord", Total: 4}, 1)
	waitFor(t, "the waiting state", func() bool { return w.o.Status().State == StateWaiting })
	if txt := string(w.o.LeaseText(w.clk.Now())); !strings.Contains(txt, "state waiting\n") || !strings.Contains(txt, "deadline none\n") || strings.Contains(txt, "error none") {
		t.Fatalf("/lease while etcd is unreachable:\n%s", txt)
	}
	if n := len(w.shards.owned(w.clk.Now())); n != 0 {
		t.Fatalf("a node that never joined owns %d shards", n)
	}
	w.stop()

	startOwnership(t, cli, "a", Plan{Flavor: "discord", Total: 4}, 1)
	waitFor(t, "the plan key", func() bool { r, _ := cli.Get(context.Background(), "/shardfs/b/plan"); return len(r.Kvs) == 1 })
	o, _ := NewOwnership(OwnershipConfig{Client: cli, Bot: "b", Node: "c", Plan: Plan{Flavor: "discord", Total: 8}, Shards: newRecShards(), Clock: clock.NewFake(), Logger: discard()})
	err = o.Run(etcdtest.Ctx(t, 20*time.Second))
	if err == nil || !strings.Contains(err.Error(), "total 4") || !strings.Contains(err.Error(), "total 8") {
		t.Fatalf("Run with another total = %v; want a refusal naming both plans", err)
	}
	if st := o.Status(); st.State != StateRefused {
		t.Fatalf("state %q; want refused", st.State)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
