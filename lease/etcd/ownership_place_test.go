package etcd

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// Issue 22 item 3 against etcd: a = 0-3 and b = 4-7 of 8 shards own all 8
// (rendezvous over the member names left shards 1, 2, 6 and 7 running
// nowhere), and a third node that may own every shard then takes a share
// without leaving any shard unowned: the candidates travel in the member
// keys.
func TestOwnershipCandidatesFromMemberKeys(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	plan := Plan{Flavor: "discord", Total: 8}
	only := func(ids ...int) func(*OwnershipConfig) {
		return func(cfg *OwnershipConfig) { cfg.Candidates = ids }
	}
	a := startOwnershipWith(t, cli, "a", plan, 8, only(0, 1, 2, 3))
	b := startOwnershipWith(t, cli, "b", plan, 8, only(4, 5, 6, 7))
	held := func() string {
		var out []string
		for id := range 8 {
			out = append(out, keys(t, cli)[id][0])
		}
		return fmt.Sprint(out)
	}
	want := "[a a a a b b b b]"
	waitFor(t, "a to hold 0-3 and b 4-7", func() bool { return held() == want })
	if n := len(a.shards.owned(a.clk.Now())) + len(b.shards.owned(b.clk.Now())); n != 8 {
		t.Fatalf("a and b run %d shards; want 8", n)
	}
	c := startOwnership(t, cli, "c", plan, 8)
	waitFor(t, "c to own 2 and a, b 3 each", func() bool {
		k := keys(t, cli)
		n := map[string]int{}
		for id := range 8 {
			n[k[id][0]]++
		}
		return len(k) == 8 && n["c"] == 2 && n["a"] == 3 && n["b"] == 3 &&
			len(c.shards.owned(c.clk.Now())) == 2
	})
	for id, k := range keys(t, cli) {
		if k[0] == "a" && !slices.Contains([]int{0, 1, 2, 3}, id) || k[0] == "b" && !slices.Contains([]int{4, 5, 6, 7}, id) {
			t.Fatalf("shard %d held by %s, which may not own it", id, k[0])
		}
	}
}
