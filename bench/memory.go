package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
)

// memorySample is one run of one side: per-shard figures of a process that
// brought n shards to READY.
type memorySample struct {
	rssPerShard        float64
	goroutinesPerShard float64
	goPerShard         float64 // Go heap in use + stacks
	heartbeats         int64
	openTime           time.Duration
}

// idleShards runs one side with n idle READY shards against a fresh
// simulator (every shard its own identify bucket, heartbeats every
// cfg.memHeartbeat) and measures the process before any shard exists and
// after all are READY and have heartbeated.
func idleShards(cfg config, side string, n int) (memorySample, error) {
	return idleShardsOver(cfg, wire{}, side, n, nil)
}

// idleShardsOver is idleShards with the clients connecting as w says.
// When breakdown is set, the client's heap is also summed by package after
// the measurement (see heapBreakdown) into it.
func idleShardsOver(cfg config, w wire, side string, n int, breakdown map[string]float64) (memorySample, error) {
	var m memorySample
	// The heartbeats are measured, not judged: with the simulator's
	// default timeout (12/11 of the interval, 18 ms at the smoke size's
	// 200 ms) a client late by a scheduling hiccup on a loaded machine
	// was closed 4009, and disgo's reconnects, identifying again inside
	// the bucket's 5 s, were refused in a loop (53 refused identifies,
	// then "not every shard stayed live").
	s, err := startSimOver(w, n, "-max-concurrency", fmt.Sprint(n), "-heartbeat", cfg.memHeartbeat.String(),
		"-heartbeat-timeout", (cfg.memHeartbeat + 10*time.Second).String())
	if err != nil {
		return m, err
	}
	defer s.close()
	var extra []string
	if breakdown != nil {
		extra = []string{"-memprofilerate", strconv.Itoa(breakdownRate)}
	}
	c, err := startClient(side, s, n, n, extra...)
	if err != nil {
		return m, err
	}
	defer c.close()
	before, err := c.measure()
	if err != nil {
		return m, err
	}
	start := time.Now()
	if err := c.begin(10 * time.Minute); err != nil {
		return m, err
	}
	if err := c.waitReady(n, 10*time.Minute); err != nil {
		return m, err
	}
	m.openTime = time.Since(start)
	hb0, err := simHeartbeats(s)
	if err != nil {
		return m, err
	}
	// Every client heartbeats at least once per interval; wait for one and
	// a half, so that every shard has done so since READY.
	time.Sleep(cfg.memHeartbeat * 3 / 2)
	hb1, err := simHeartbeats(s)
	if err != nil {
		return m, err
	}
	m.heartbeats = hb1 - hb0
	after, err := c.measure()
	if err != nil {
		return m, err
	}
	if _, err := s.call(time.Minute, "wait-live %d 10s", n); err != nil {
		return m, fmt.Errorf("not every shard stayed live: %w", err)
	}
	if breakdown != nil {
		if err := c.heapBreakdown(n, breakdown); err != nil {
			return m, err
		}
	}
	m.rssPerShard = float64(after.rss-before.rss) / float64(n)
	m.goroutinesPerShard = float64(after.goroutines-before.goroutines) / float64(n)
	m.goPerShard = float64(after.heap+after.stack-before.heap-before.stack) / float64(n)
	return m, nil
}

type simTotals struct {
	Identifies, RefusedIdentifies, Resumes, FailedResumes int64
	Heartbeats, LiveSessions, MaxLiveSessions             int64
	Published, Dispatched                                 int64
}

func (s *sim) totals() (simTotals, error) {
	out, err := s.call(time.Minute, "stats")
	if err != nil {
		return simTotals{}, err
	}
	var t simTotals
	err = json.Unmarshal([]byte(out), &t)
	return t, err
}

func simHeartbeats(s *sim) (int64, error) {
	t, err := s.totals()
	return t.Heartbeats, err
}

func runMemory(cfg config, log io.Writer) (*section, error) {
	sides := []string{sideShardfs, sideDiscordgo, sideDisgo}
	sec := &section{columns: sides}
	rssV := map[string][]float64{}
	grV := map[string][]float64{}
	goV := map[string][]float64{}
	for i := range cfg.runs {
		for _, side := range sides {
			m, err := idleShards(cfg, side, cfg.memShards)
			if err != nil {
				return sec, fmt.Errorf("%s, %d shards: %w", side, cfg.memShards, err)
			}
			rssV[side] = append(rssV[side], m.rssPerShard)
			grV[side] = append(grV[side], m.goroutinesPerShard)
			goV[side] = append(goV[side], m.goPerShard)
			fmt.Fprintf(log, "bench: memory run %d: %s: %.0f B/shard RSS, %.2f goroutines/shard, %d heartbeats, READY in %v\n",
				i+1, side, m.rssPerShard, m.goroutinesPerShard, m.heartbeats, m.openTime.Round(time.Millisecond))
		}
	}
	best := sideDiscordgo
	if median(rssV[sideDisgo]) < median(rssV[best]) {
		best = sideDisgo
	}
	ratio := median(rssV[sideShardfs]) / median(rssV[best])
	sec.add(row{
		measure: fmt.Sprintf("resident memory per READY shard, %d shards", cfg.memShards), unit: "bytes",
		values: rssV, ratio: fmt.Sprintf("%.2f of %s (1/%.1f)", ratio, best, 1/ratio),
		target: "≤ 0.33 of the best peer", met: boolp(ratio <= 1.0/3),
	})
	grRatio := median(grV[sideShardfs]) / min(median(grV[sideDiscordgo]), median(grV[sideDisgo]))
	sec.add(row{
		measure: "goroutines per READY shard", values: grV, digits: 2,
		ratio: fmt.Sprintf("%.2f", grRatio),
	})
	sec.add(row{
		measure: "Go heap in use + stacks per shard", unit: "bytes", values: goV,
		ratio: fmt.Sprintf("%.2f", median(goV[sideShardfs])/min(median(goV[sideDiscordgo]), median(goV[sideDisgo]))),
	})

	// shardfs alone at the larger scale.
	big := map[string][]float64{}
	bigGr := map[string][]float64{}
	bigGo := map[string][]float64{}
	var openTimes []float64
	for i := range cfg.memBigRuns {
		m, err := idleShards(cfg, sideShardfs, cfg.memBigShards)
		if err != nil {
			return sec, fmt.Errorf("shardfs, %d shards: %w", cfg.memBigShards, err)
		}
		big[sideShardfs] = append(big[sideShardfs], m.rssPerShard)
		bigGr[sideShardfs] = append(bigGr[sideShardfs], m.goroutinesPerShard)
		bigGo[sideShardfs] = append(bigGo[sideShardfs], m.goPerShard)
		openTimes = append(openTimes, m.openTime.Seconds())
		fmt.Fprintf(log, "bench: memory %d shards run %d: %.0f B/shard RSS, %.2f goroutines/shard, READY in %v\n",
			cfg.memBigShards, i+1, m.rssPerShard, m.goroutinesPerShard, m.openTime.Round(time.Millisecond))
	}
	sec.add(row{measure: fmt.Sprintf("resident memory per READY shard, %d shards (shardfs alone)", cfg.memBigShards), unit: "bytes", values: big})
	sec.add(row{measure: fmt.Sprintf("goroutines per READY shard, %d shards", cfg.memBigShards), values: bigGr, digits: 2})
	sec.add(row{measure: fmt.Sprintf("Go heap in use + stacks per shard, %d shards", cfg.memBigShards), unit: "bytes", values: bigGo})
	sec.add(row{measure: fmt.Sprintf("time until %d shards READY", cfg.memBigShards), unit: "s", values: map[string][]float64{sideShardfs: openTimes}, digits: 1})

	sec.method = []string{
		fmt.Sprintf("Each run starts a fresh simulator (%d shards, max_concurrency %d so that no identify waits, heartbeat interval %v) and a fresh client process: "+
			"a shardfs node (no compression, its 9P listener open), one discordgo Session per shard (state tracking off, events handled synchronously), "+
			"or disgo's shard manager with the shard ids passed explicitly and OpenShard called for one shard after the other. "+
			"The client's memory is read once before any shard exists (the shardfs node before it is built; the peers before their first Open) and once after every shard is READY and %v more have passed, "+
			"so that every shard has heartbeated at least once. Before each reading the process runs three garbage collections and returns free memory to the OS (debug.FreeOSMemory), the same on every side.",
			cfg.memShards, cfg.memShards, cfg.memHeartbeat, cfg.memHeartbeat*3/2),
		fmt.Sprintf("Per shard = (VmRSS with N READY shards − VmRSS of the same process with 0 shards) / N, N = %d; everything the client builds for its shards, fixed costs included, is charged to them. "+
			"Goroutines per shard are computed the same way from runtime.NumGoroutine. The shardfs-alone rows use N = %d (%d runs).",
			cfg.memShards, cfg.memBigShards, cfg.memBigRuns),
	}
	return sec, nil
}
