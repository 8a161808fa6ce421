package node

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// A token revoked while the fleet runs (attack on issue 22, F2's
// remainder): the gateway's token changes and a shard of node a
// reconnects, refused with 4004. Before, every shard of a went FATAL with
// its key held, so no node with a good token could take them. Now a hands
// every key back and leaves (/lease: state left, the token named as why);
// b takes a's shards, is refused too at its first connection, and does
// likewise, so no key is left; a node c started with the new token takes
// all 8 and runs them.
func TestFleetTokenRevokedReleasesKeys(t *testing.T) {
	const total = 8
	srv := etcdtest.Start(t)
	cli := srv.Client()
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: total, MaxConcurrency: total})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() }) // after the nodes' Close
	a := fleetNode(t, cli, sim, "a", total, total)
	within(t, time.Minute, "a: 8 shards READY", func() bool { return readyOwned(a) == total })
	b := fleetNode(t, cli, sim, "b", total, total)
	within(t, time.Minute, "a and b to share the 8 shards, READY", func() bool {
		return readyOwned(a) > 0 && readyOwned(b) > 0 && readyOwned(a)+readyOwned(b) == total
	})
	var ofA int
	for _, d := range a.Scheduler.Snapshot(nil) {
		if d.Owned() {
			ofA = d.Shard
			break
		}
	}
	sim.SetToken("new-token")
	if n := sim.Inject(ofA, gatewaysim.Fault{Kind: gatewaysim.FaultReconnect}); n != 1 {
		t.Fatalf("Inject(reconnect) on a's shard %d touched %d connections; want 1", ofA, n)
	}
	for _, n := range []*Node{a, b} {
		within(t, time.Minute, n.Fleet.Ownership.Status().Node+" to leave the fleet", func() bool {
			return strings.Contains(file(t, n, "lease"), "state left\n")
		})
		if l := file(t, n, "lease"); !strings.Contains(l, "the bot's token was refused") {
			t.Fatalf("/lease of a node that left for a refused token does not say why:\n%s", l)
		}
		// It reads etcd no more: its last view would be stale (attack
		// 22b, F3).
		if o := file(t, n, "owners"); !strings.HasPrefix(o, "0 unknown unknown\n") {
			t.Fatalf("/owners of a node that left: %q...; want unknown", o[:min(len(o), 60)])
		}
	}
	r, err := cli.Get(etcdtest.Ctx(t, 5*time.Second), "/shardfs/b/shards/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 0 {
		t.Fatalf("%d shard keys held after both nodes' token was refused; want none", r.Count)
	}
	c, err := New(Config{
		Flavor: core.Discord, Token: "new-token", GatewayURL: sim.GatewayURL(),
		Plan: core.Range(total, 0, total-1), MaxConcurrency: total,
		Logger: slog.New(slog.NewTextHandler(testWriter{t, "c"}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Etcd:   &Etcd{Client: cli, Bot: "b", Node: "c"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Start()
	within(t, time.Minute, "c (the new token): 8 shards READY", func() bool { return readyOwned(c) == total })
	if tot := sim.Totals(); tot.MaxLiveSessions != 1 {
		t.Fatalf("at most %d live sessions a shard; want never 2", tot.MaxLiveSessions)
	}
}
