package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/shardfs/shardfs/soak"
)

// runFleet runs the failover soak of package soak (the same code as its CI
// test, which runs 20 faults) with cfg.fleetFaults faults, then times the
// stop of a lone fleet node with cfg.fleetStopShards shards (runFleetStop).
// The smoke test leaves both 0: the soak takes minutes and has its own
// test, and so has the stop.
func runFleet(cfg config, log io.Writer) (*section, error) {
	sec := &section{columns: []string{"shardfs"}}
	if cfg.fleetFaults == 0 && cfg.fleetStopShards == 0 {
		sec.skipped = "not run in the smoke test; soak.TestSoak runs the same code with 20 faults in CI, node.TestFleetLoneStop the stop with 16 shards."
		return sec, nil
	}
	var err error
	if cfg.fleetFaults > 0 {
		err = runSoak(cfg, log, sec)
	}
	if cfg.fleetStopShards > 0 {
		err = errors.Join(err, runFleetStop(cfg, log, sec))
	}
	return sec, err
}

// runSoak adds the soak's rows to sec.
func runSoak(cfg config, log io.Writer, sec *section) error {
	dir, err := os.MkdirTemp("", "shardfs-bench-fleet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := buildServe(dir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.fleetFaults)*time.Minute)
	defer cancel()
	sc := soak.Config{Faults: cfg.fleetFaults, Serve: bin, Exe: self(), Dir: dir, Log: prefixWriter{role: "fleet", w: log}, Verbose: verbose,
		EtcdMembers: cfg.fleetMembers, TTL: cfg.fleetTTL, HangBound: cfg.fleetHangBound}
	if cfg.fleetMembers >= 3 {
		sc.Kinds = append(slices.Clone(soak.Kinds), soak.ClusterKinds...)
	}
	rep, err := soak.Run(ctx, sc)
	if rep == nil {
		return err
	}
	bound := rep.Config.Bound().Seconds()
	worst := 0.0
	for _, k := range rep.Config.Kinds {
		ds := rep.Failover[k]
		if len(ds) == 0 {
			continue
		}
		var v []float64
		for _, d := range ds {
			v = append(v, d.Seconds())
			worst = max(worst, d.Seconds())
		}
		sec.add(row{measure: "failover, " + string(k) + " (fault → every shard READY on exactly one node)", unit: "s", values: map[string][]float64{"shardfs": v}, digits: 1,
			target: fmt.Sprintf("within TTL + 10 s = %.0f s", bound), met: boolp(maxOf(v) <= bound)})
	}
	sec.add(row{measure: "most live sessions of one shard at the gateway", values: map[string][]float64{"shardfs": {float64(rep.MaxLive)}},
		target: "1, never a duplicate", met: boolp(rep.MaxLive == 1)})
	sec.add(row{measure: "frames sent for a shard the sender did not own", values: map[string][]float64{"shardfs": {float64(len(rep.ForeignFrames))}},
		target: "0", met: boolp(len(rep.ForeignFrames) == 0 && len(rep.Violations) == 0)})
	if len(rep.Wakes) > 0 {
		most := 0
		for _, w := range rep.Wakes {
			most = max(most, w.Stale, w.Copies)
		}
		sec.add(row{measure: "most events a node woken from SIGSTOP delivered after its deadline (or that another node delivered too)", values: map[string][]float64{"shardfs": {float64(most)}},
			target: "0", met: boolp(most == 0)})
	}
	if len(rep.Placements) > 0 {
		balanced, over := 0, 0
		for _, p := range rep.Placements {
			if p.Balanced {
				balanced++
			}
			if p.Change != "etcd" && p.Moves > p.MoveBound(rep.Config.Shards) {
				over++
			}
		}
		sec.add(row{measure: "joins and leaves whose placement was not balanced, or moved more than ⌈N/M⌉ + 1", values: map[string][]float64{"shardfs": {float64(len(rep.Placements) - balanced + over)}},
			target: "0", met: boolp(balanced == len(rep.Placements) && over == 0)})
	}
	for _, k := range []soak.Kind{soak.EtcdKill, soak.MemberKill, soak.LeaderKill, soak.MemberPartition} {
		if n := rep.Faults[k]; n > 0 {
			target, met := "", (*bool)(nil)
			if k != soak.EtcdKill {
				target, met = "0 (etcd kept a quorum)", boolp(rep.Sessions[k].Identifies == 0)
			}
			sec.add(row{measure: "identifies per fault, " + string(k), values: map[string][]float64{"shardfs": {float64(rep.Sessions[k].Identifies) / float64(n)}}, digits: 1,
				target: target, met: met})
		}
	}
	sec.method = []string{fmt.Sprintf("`soak.Run` (package soak, the code of the CI test TestSoak, which runs 20): %d faults against %d `shardfs serve --etcd` processes built from this tree, "+
		"a real etcd (v3.7.3, embedded, %d member(s), each in a child process), the gateway simulator in the harness's process, %d shards, `--etcd-ttl %v`. "+
		"Faults in turn, each round of the kinds shuffled, on a node drawn at random (seed %d). The package doc of soak explains the checks and the simulator's heartbeat of TTL/4.",
		rep.Config.Faults, rep.Config.Nodes, rep.Config.EtcdMembers, rep.Config.Shards, rep.Config.TTL, rep.Config.Seed)}
	sec.extra = []string{rep.Table()}
	if err == nil {
		err = rep.Err()
	}
	return err
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}
