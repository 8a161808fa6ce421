package node

import (
	"flag"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// stopShards sizes TestFleetLoneStop; bench/RESULTS.md has the run with
// -fleet.stop-shards=1024.
var stopShards = flag.Int("fleet.stop-shards", 16, "shards of TestFleetLoneStop")

// A lone node stops without pacing (issue 22, items 9 and the move
// pacing): it starts with --max-concurrency 1 while discovery says
// max_concurrency is the shard count, so on Close its drain hands every
// shard to nobody, each with its snapshot saved, within a bound far below
// one move per 5 s (on the old code the 16 moves took 75 s, past the 30 s
// bound, and the rest were released by revoking the lease). Started
// again, the node resumes every shard: the stop and the restart cost no
// identify. The planned moves of a node that has other members to hand to
// follow the max_concurrency discovery gave (the fleet's pacing figure).
func TestFleetLoneStop(t *testing.T) {
	total := *stopShards
	srv := etcdtest.Start(t)
	cli := srv.Client()
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: total, MaxConcurrency: total})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() }) // after the nodes' Close
	start := func() *Node {
		s, err := New(Config{
			Flavor: core.Discord, Token: "sim-token", API: sim.APIURL(),
			Plan: core.Range(total, 0, total-1), MaxConcurrency: 1,
			Logger: slog.New(slog.NewTextHandler(testWriter{t, "a"}, &slog.HandlerOptions{Level: slog.LevelWarn})),
			Etcd:   &Etcd{Client: cli, Bot: "b", Node: "a", DrainTimeout: 30 * time.Second},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.Start()
		return s
	}
	a := start()
	within(t, time.Duration(total)*time.Second+time.Minute, fmt.Sprintf("a: %d shards READY", total), func() bool { return readyOwned(a) == total })
	if got := a.Fleet.maxConcurrency(); got != total {
		t.Fatalf("the fleet paces planned moves at max_concurrency %d; want discovery's %d, not the flag's 1", got, total)
	}
	before := sim.Totals()
	began := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	t.Logf("a lone node with %d shards stopped in %v", total, took.Round(time.Millisecond))
	if a.Fleet.drainErr != nil {
		t.Fatalf("the drain at Close: %v; want every shard handed over", a.Fleet.drainErr)
	}
	if st := a.Fleet.Ownership.Status(); st.Moves != uint64(total) || st.FencingStops != 0 {
		t.Fatalf("after Close: %d moves, %d fencing stops; want %d moves, none", st.Moves, st.FencingStops, total)
	}
	a = start()
	within(t, time.Duration(total)*time.Second+time.Minute, fmt.Sprintf("a again: %d shards READY", total), func() bool { return readyOwned(a) == total })
	after := sim.Totals()
	if n := after.Identifies - before.Identifies; n != 0 || after.Resumes-before.Resumes < int64(total) || after.MaxLiveSessions != 1 {
		t.Fatalf("stop and restart: %d identifies, %d resumes, at most %d live sessions a shard; want 0 identifies, %d resumes, never 2 live", n, after.Resumes-before.Resumes, after.MaxLiveSessions, total)
	}
}
