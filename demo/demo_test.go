package demo

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor waits for cond, re-checking at every line of the node's events
// log and at every dispatch, for at most 30 s.
func waitFor(t *testing.T, d *Demo, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func allReady(d *Demo) bool {
	for _, diag := range d.Node.Scheduler.Snapshot(nil) {
		if diag.State != core.Ready {
			return false
		}
	}
	return true
}

func TestDemoFlows(t *testing.T) {
	for _, flavor := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(flavor.String(), func(t *testing.T) {
			d, err := Start(context.Background(), Config{Flavor: flavor, Shards: 3, Traffic: 50})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			waitFor(t, d, "all shards READY", func() bool { return allReady(d) })
			waitFor(t, d, "dispatches on every shard", func() bool {
				for id := range 3 {
					if d.Tree.DispatchLog(id).Size() == 0 {
						return false
					}
				}
				return true
			})
		})
	}
}
