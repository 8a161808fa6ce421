package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/soak"
)

// runFleetStop measures the stop of a lone fleet node with many READY
// shards (issue 22, item 9's measure: under 10 s at 1,024 shards), the
// code of node's TestFleetLoneStopLarge: a node built by node.New as serve
// builds it, against a real etcd in a child process, whose Close is what
// SIGTERM runs (the drain: every shard stopped with 4000, its snapshot
// saved, its key released, unpaced since its shards go to nobody). Then
// the node starts again and must resume every shard, identify none.
// Fluxer's flavor, with the simulator's and the node's identify budgets
// raised so that the start takes seconds: a Discord start across a fleet
// goes through one etcd slot per identify (1,024 shards were not all READY
// after 18 minutes), and the stop does not depend on the flavor. The smoke
// test leaves fleetStopShards 0; node's TestFleetLoneStop runs the same
// stop with 16 shards in CI. Its rows and paragraph go to sec, the soak's
// section.
func runFleetStop(cfg config, log io.Writer, sec *section) error {
	total := cfg.fleetStopShards
	var stops, starts []float64
	var identifies, resumes int64
	for run := range max(cfg.fleetStopRuns, 1) {
		r, err := fleetStopOnce(total, log)
		if err != nil {
			return fmt.Errorf("stop of a lone node, run %d: %w", run+1, err)
		}
		fmt.Fprintf(log, "fleet-stop: run %d: %d shards READY in %v, stopped in %v; restart: %d identifies, %d resumes\n",
			run+1, total, r.start.Round(time.Millisecond), r.stop.Round(time.Millisecond), r.identifies, r.resumes)
		stops = append(stops, r.stop.Seconds())
		starts = append(starts, r.start.Seconds())
		identifies += r.identifies
		resumes += r.resumes
	}
	sec.add(row{measure: fmt.Sprintf("stop (SIGTERM's drain, node.Close) of a lone fleet node with %d READY shards", total), unit: "s",
		values: map[string][]float64{"shardfs": stops}, digits: 2, target: "under 10 s", met: boolp(maxOf(stops) < 10)})
	sec.add(row{measure: "identifies when it started again (every shard resumed)", values: map[string][]float64{"shardfs": {float64(identifies)}},
		target: "0", met: boolp(identifies == 0 && resumes >= int64(total*len(stops)))})
	sec.method = append(sec.method, fmt.Sprintf("The stop of a lone node: the code of node's TestFleetLoneStopLarge, %d runs: each starts a real etcd (embedded v3.7.3, a child process), the gateway simulator (Fluxer's flavor, identify budget raised) and one node "+
		"(node.New as `shardfs serve --etcd` builds it, %d shards, the whole plan, Fluxer pacing raised so that the start takes seconds: %.1f s median here), waits until every shard is READY, "+
		"then times Close, which is what SIGTERM runs: the drain stops every shard with 4000, saves its snapshot and releases its key, without pacing since its shards go to nobody. "+
		"The node then starts again against the same etcd; every shard must resume (%d resumes over the runs) and none identify.", len(stops), total, median(starts), resumes))
	return nil
}

type fleetStopRun struct {
	start, stop         time.Duration
	identifies, resumes int64
}

func fleetStopOnce(total int, log io.Writer) (r fleetStopRun, err error) {
	dir, err := os.MkdirTemp("", "shardfs-bench-fleet-stop-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	e, err := soak.NewEtcd(self(), filepath.Join(dir, "etcd"))
	if err != nil {
		return r, err
	}
	ctx := context.Background()
	if err := e.Start(ctx); err != nil {
		return r, err
	}
	defer e.Kill()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return r, err
	}
	defer cli.Close()
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Fluxer, Shards: total, IdentifyBudget: 1 << 20})
	if err != nil {
		return r, err
	}
	defer sim.Close()
	logger := slog.New(slog.NewTextHandler(prefixWriter{role: "fleet-stop", w: log}, &slog.HandlerOptions{Level: slog.LevelError}))
	start := func() (*node.Node, time.Duration, error) {
		n, err := node.New(node.Config{
			Flavor: core.Fluxer, Token: "sim-token", GatewayURL: sim.GatewayURL() + "/?v=1&encoding=json",
			Plan:         core.Range(total, 0, total-1),
			FluxerPacing: core.FluxerPacing{Budget: 1 << 20, Window: time.Minute, Spacing: time.Millisecond},
			Logger:       logger,
			Etcd:         &node.Etcd{Client: cli, Bot: "b", Node: "a", DrainTimeout: 5 * time.Minute},
		})
		if err != nil {
			return nil, 0, err
		}
		began := time.Now()
		n.Start()
		for deadline := began.Add(10 * time.Minute); readyOwned(n) < total; {
			if time.Now().After(deadline) {
				n.Close()
				return nil, 0, fmt.Errorf("%d of %d shards READY after 10 minutes", readyOwned(n), total)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return n, time.Since(began), nil
	}
	n, took, err := start()
	if err != nil {
		return r, err
	}
	r.start = took
	before := sim.Totals()
	began := time.Now()
	err = n.Close()
	r.stop = time.Since(began)
	if err != nil {
		return r, fmt.Errorf("Close: %w", err)
	}
	if st := n.Fleet.Ownership.Status(); st.Moves != uint64(total) {
		return r, fmt.Errorf("the drain at Close handed %d shards over; want %d", st.Moves, total)
	}
	if n, _, err = start(); err != nil {
		return r, fmt.Errorf("again: %w", err)
	}
	after := sim.Totals()
	n.Close()
	r.identifies, r.resumes = after.Identifies-before.Identifies, after.Resumes-before.Resumes
	return r, nil
}

// readyOwned counts the node's READY shards that it owns.
func readyOwned(n *node.Node) int {
	ready := 0
	for _, d := range n.Scheduler.Snapshot(nil) {
		if d.Owned() && d.State == core.Ready {
			ready++
		}
	}
	return ready
}
