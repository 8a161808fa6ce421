package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/shardfs/shardfs/internal/poll"
)

type throughput struct {
	perCPUSecond float64 // events per CPU-second of the client process
	perSecond    float64 // events per wall second
	cpuPerEvent  time.Duration
}

// floodClient brings a side's shards READY, floods each with perShard
// 700-byte MESSAGE_CREATEs as fast as it takes them, and measures the
// client process's CPU time until its handler (or shardfs's dispatch logs)
// has every event.
func floodClient(cfg config, side string) (throughput, error) {
	return floodClientOver(cfg, wire{}, side)
}

// floodClientOver is floodClient with the client connecting as w says.
func floodClientOver(cfg config, w wire, side string) (throughput, error) {
	var t throughput
	n := cfg.dispatchShards
	s, err := startSimOver(w, n, "-max-concurrency", fmt.Sprint(n))
	if err != nil {
		return t, err
	}
	defer s.close()
	c, err := startClient(side, s, n, n)
	if err != nil {
		return t, err
	}
	defer c.close()
	if err := c.begin(5 * time.Minute); err != nil {
		return t, err
	}
	if err := c.waitReady(n, 5*time.Minute); err != nil {
		return t, err
	}
	flood := func(per int) (time.Duration, time.Duration, error) {
		base, err := c.count()
		if err != nil {
			return 0, 0, err
		}
		cpu0, err := cpuTime(c.pid())
		if err != nil {
			return 0, 0, err
		}
		start := time.Now()
		if _, err := s.call(time.Minute, "flood 0 %d %d", n-1, per); err != nil {
			return 0, 0, err
		}
		want := base + int64(n*per)
		err = poll.Until(context.Background(), fmt.Sprintf("%d events", want-base), 5*time.Minute, 10*time.Millisecond, func() error {
			got, err := c.count()
			if err != nil {
				return poll.Stop(err)
			}
			if got < want {
				return fmt.Errorf("%d of %d events", got-base, want-base)
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
		elapsed := time.Since(start)
		cpu1, err := cpuTime(c.pid())
		return cpu1 - cpu0, elapsed, err
	}
	if _, _, err := flood(max(cfg.dispatchPerShard/10, 1)); err != nil { // warm up
		return t, err
	}
	cpu, elapsed, err := flood(cfg.dispatchPerShard)
	if err != nil {
		return t, err
	}
	events := float64(n * cfg.dispatchPerShard)
	t.perCPUSecond = events / max(cpu, clockTick).Seconds()
	t.perSecond = events / elapsed.Seconds()
	t.cpuPerEvent = time.Duration(float64(cpu) / events)
	return t, nil
}

func runDispatch(cfg config, log io.Writer) (*section, error) {
	sides := []string{sideShardfs, sideDiscordgo, sideDisgo}
	sec := &section{columns: sides}
	perCPU := map[string][]float64{}
	perSec := map[string][]float64{}
	cpuPer := map[string][]float64{}
	for i := range cfg.runs {
		for _, side := range sides {
			t, err := floodClient(cfg, side)
			if err != nil {
				return sec, fmt.Errorf("%s: %w", side, err)
			}
			perCPU[side] = append(perCPU[side], t.perCPUSecond)
			perSec[side] = append(perSec[side], t.perSecond)
			cpuPer[side] = append(cpuPer[side], float64(t.cpuPerEvent.Nanoseconds())/1000)
			fmt.Fprintf(log, "bench: dispatch run %d: %s: %.0f events/CPU-s, %.0f events/s, %v CPU/event\n", i+1, side, t.perCPUSecond, t.perSecond, t.cpuPerEvent)
		}
	}
	best := sideDiscordgo
	if median(perCPU[sideDisgo]) > median(perCPU[best]) {
		best = sideDisgo
	}
	ratio := median(perCPU[sideShardfs]) / median(perCPU[best])
	sec.add(row{
		measure: "dispatch events per CPU-second of the client", unit: "events/CPU-s", values: perCPU,
		ratio: fmt.Sprintf("%.2f× %s", ratio, best), target: "≥ 2× the best peer", met: boolp(ratio >= 2),
	})
	sec.add(row{measure: "client CPU per event", unit: "µs", values: cpuPer, digits: 1})
	sec.add(row{measure: "events per wall second (simulator and client share the 2 cores)", unit: "events/s", values: perSec})
	sec.method = []string{
		fmt.Sprintf("Each run starts a fresh simulator and client process with %d shards READY (no compression, JSON), then has the simulator flood every shard with %d MESSAGE_CREATEs of about 700 bytes (gatewaysim.Flood: each connection as fast as its client reads), after a warm-up flood of a tenth of that. "+
			"The client's CPU time (utime+stime of its process) is read before the flood and once its count has every event. "+
			"shardfs writes every event to its dispatch logs (the real shardfs.Tree sink: a JSON line in the shard's log and the node's); discordgo (state off, synchronous events) and disgo count MESSAGE_CREATEs in a handler, which their libraries have already decoded into structs.",
			cfg.dispatchShards, cfg.dispatchPerShard),
	}
	return sec, nil
}
