package integration

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/shardfs"
)

// testNode is the shardfs node the guest mounts, served by the test
// process.
type testNode struct {
	Scheduler *core.Scheduler
	Tree      *shardfs.Tree
	Server    *fsrv.Server
	// Inject makes a READY shard's connection fail once and returns text
	// that the resulting line of the shard's events contains.
	Inject func(shard, n int) string
}

// startNode starts the whole stack with shards shards, all local to the
// node: the gateway simulator, the gateway client, the core and the tree
// (package demo), with dispatch traffic flowing.
func startNode(t *testing.T, shards int) *testNode {
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := demo.Start(context.Background(), demo.Config{
		Flavor: core.Discord, Shards: shards, Logger: log,
		// A shard whose connection fails is back at once, so that the
		// next scenario finds it READY.
		Backoff: core.Fixed(100 * time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("demo: Close = %v", err)
		}
	})
	return &testNode{
		Scheduler: d.Node.Scheduler, Tree: d.Tree, Server: d.Server,
		Inject: func(shard, n int) string {
			text := fmt.Sprintf("injected failure %d", n)
			// The gateway client puts the close reason in its error.
			if d.Sim.Inject(shard, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4000, Reason: text}) == 0 {
				t.Errorf("simulator: shard %d has no connection to fail", shard)
			}
			return text
		},
	}
}
