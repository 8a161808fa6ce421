package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/soak"
)

// An etcd outage costs no identify when nobody else took the shards
// (issue 22, item 8; DESIGN 7.3): a lone node with 16 READY shards, its
// etcd (a child process) killed for 2 × TTL. The node fences itself
// (every shard STOPPED, lease lost), etcd restarts on its data, the node
// joins again and, etcd's history showing no other owner, every shard
// resumes its own session: the simulator counts the 16 identifies of the
// start and none after, and never two live sessions of a shard. Before,
// each shard identified again (the soak counted 16 per etcd kill).
func TestFleetEtcdOutageNoIdentify(t *testing.T) {
	const total, ttl = 16, 3 * time.Second
	e, cli := soak.StartEtcd(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: total, MaxConcurrency: total})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	s, err := New(Config{
		Flavor: core.Discord, Token: "sim-token", GatewayURL: sim.GatewayURL(),
		Plan: core.Range(total, 0, total-1), MaxConcurrency: total,
		Logger: slog.New(slog.NewTextHandler(testWriter{t, "a"}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Etcd:   &Etcd{Client: cli, Bot: "b", Node: "a", TTL: ttl, DrainTimeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Start()
	within(t, time.Minute, "16 shards READY", func() bool { return readyOwned(s) == total })
	start := sim.Totals()
	e.Kill()
	within(t, time.Minute, "every shard stopped by the fence", func() bool {
		for _, d := range s.Scheduler.Snapshot(nil) {
			if d.State != core.Stopped || d.StopReason != core.StoppedByLeaseLost {
				return false
			}
		}
		return true
	})
	<-time.After(2 * ttl) // etcd stays down for 2 × TTL: the outage is the test's subject, not a wait for a state
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	within(t, 2*time.Minute, "16 shards READY after the outage", func() bool { return readyOwned(s) == total })
	end := sim.Totals()
	if n := end.Identifies - start.Identifies; n != 0 || end.Resumes-start.Resumes < total || end.MaxLiveSessions != 1 {
		t.Fatalf("the outage cost %d identifies, %d resumes, at most %d live sessions a shard; want 0 identifies, %d resumes, never 2 live", n, end.Resumes-start.Resumes, end.MaxLiveSessions, total)
	}
}
