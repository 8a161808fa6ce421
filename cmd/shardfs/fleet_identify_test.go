package main

import (
	"testing"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// A new process of a fleet respects the 5 s spacing of a bucket from its
// first identify (issue 23 item 7 for a fleet): node a identifies shard 0
// and is killed (SIGKILL: nothing is handed over, no key revoked); node b
// starts and takes the shard once a's key has expired (--etcd-ttl 3s),
// about 4 s after a's identify. The last identify of the bucket is kept
// in etcd as the bucket key (identify/0), on a lease of 7 s from the
// slot's start that nobody revokes: b's slot waits for it, and its
// identify goes out at least 5 s after a's, so the simulator, which
// refuses (op 9) an identify within Discord's 5 s of its bucket's last,
// refuses none.
func TestServeFleetKilledKeepsIdentifySpacing(t *testing.T) {
	srv := etcdtest.Start(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 1, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if got := sim.Config().IdentifyInterval; got.Seconds() != 5 {
		t.Fatalf("simulator identify interval %v; the test is about Discord's 5 s", got)
	}
	bin := binDir(t)
	a := startFleetNode(t, bin, sim, srv.Endpoint, "a", "--max-concurrency", "1")
	a.waitReady(t, 1)
	a.cmd.Process.Kill()
	a.cmd.Wait()
	b := startFleetNode(t, bin, sim, srv.Endpoint, "b", "--max-concurrency", "1")
	b.waitReady(t, 1)
	if tot := sim.Totals(); tot.Identifies != 2 || tot.RefusedIdentifies != 0 {
		t.Fatalf("simulator after a's kill and b's start: %d identifies, %d refused; want 2, none refused (b waited 5 s from a's identify)", tot.Identifies, tot.RefusedIdentifies)
	}
}
