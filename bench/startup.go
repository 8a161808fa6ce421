package main

import (
	"fmt"
	"io"
	"strconv"
	"time"
)

type startupResult struct {
	elapsed time.Duration
	refused int64
}

// startupRun starts n shards of a side against a simulator that enforces
// max_concurrency mc with an identify window, and times the first command
// to the moment the simulator sees the last shard's session live.
func startupRun(cfg config, side string) (startupResult, error) {
	var r startupResult
	n, mc := cfg.startupShards, cfg.startupConcurrency
	s, err := startSim(n, "-max-concurrency", strconv.Itoa(mc), "-identify-interval", cfg.startupWindow.String())
	if err != nil {
		return r, err
	}
	defer s.close()
	c, err := startClient(side, s, n, mc)
	if err != nil {
		return r, err
	}
	defer c.close()
	limit := startupLimit(cfg)
	timeout := 2*limit + time.Minute
	type answer struct {
		v   []int64
		err error
	}
	live := make(chan answer, 1)
	began := make(chan error, 1)
	start := time.Now()
	go func() { began <- c.begin(timeout) }()
	go func() {
		v, err := s.callInts(timeout+time.Minute, "wait-live %d %v", n, timeout)
		live <- answer{v, err}
	}()
	a := <-live
	if a.err != nil {
		return r, a.err
	}
	if err := <-began; err != nil {
		return r, err
	}
	r.elapsed = time.Unix(0, a.v[0]).Sub(start)
	t, err := s.totals()
	if err != nil {
		return r, err
	}
	r.refused = t.RefusedIdentifies
	return r, nil
}

// startupLimit is the physical limit the target is set against:
// ceil(shards / max_concurrency) identify windows.
func startupLimit(cfg config) time.Duration {
	rounds := (cfg.startupShards + cfg.startupConcurrency - 1) / cfg.startupConcurrency
	return time.Duration(rounds) * cfg.startupWindow
}

func runStartup(cfg config, log io.Writer) (*section, error) {
	sides := []string{sideShardfs, sideDisgo}
	sec := &section{columns: sides}
	times := map[string][]float64{}
	refused := map[string][]float64{}
	for i := range cfg.startupRuns {
		for _, side := range sides {
			r, err := startupRun(cfg, side)
			if err != nil {
				return sec, fmt.Errorf("%s: %w", side, err)
			}
			times[side] = append(times[side], r.elapsed.Seconds())
			refused[side] = append(refused[side], float64(r.refused))
			fmt.Fprintf(log, "bench: startup run %d: %s: all READY in %v, %d identifies refused\n", i+1, side, r.elapsed.Round(time.Millisecond), r.refused)
		}
	}
	limit := startupLimit(cfg)
	rounds := (cfg.startupShards + cfg.startupConcurrency - 1) / cfg.startupConcurrency
	ratio := median(times[sideShardfs]) / limit.Seconds()
	worst, _ := minMax(nil)
	if v := times[sideShardfs]; len(v) > 0 {
		_, worst = minMax(v)
	}
	sec.add(row{
		measure: fmt.Sprintf("time until %d shards READY, max_concurrency %d", cfg.startupShards, cfg.startupConcurrency), unit: "s",
		values: times, digits: 2,
		ratio:  fmt.Sprintf("%.3f of the limit (worst run %.3f)", ratio, worst/limit.Seconds()),
		target: fmt.Sprintf("within 2%% of %v", limit), met: boolp(worst <= limit.Seconds()*1.02),
	})
	_, maxRefused := minMax(refused[sideShardfs])
	sec.add(row{
		measure: "identifies refused by the simulator", values: refused,
		ratio: fmt.Sprintf("%.0f", maxRefused), target: "none", met: boolp(maxRefused == 0),
	})
	sec.method = []string{
		fmt.Sprintf("Each run starts a fresh simulator that enforces Discord's identify rule for max_concurrency %d: one identify per bucket (shard %% %d) per %v; an identify inside the window is answered with op 9 and counted as refused. "+
			"The limit is ceil(%d / %d) × %v = %v; since the first round identifies at once, the last of the %d rounds can start at %v, so a client that never loses a slot finishes just after that. "+
			"The time runs from the command that starts the client (the node's start; disgo's first OpenShard) to the moment the simulator sees every shard's session live. "+
			"disgo: its shard manager with max_concurrency %d and OpenShard called for one shard after the other (its concurrent Open is unsafe above max_concurrency 1). "+
			"%d runs per side: each takes about %v.",
			cfg.startupConcurrency, cfg.startupConcurrency, cfg.startupWindow, cfg.startupShards, cfg.startupConcurrency, cfg.startupWindow, limit,
			rounds, time.Duration(rounds-1)*cfg.startupWindow, cfg.startupConcurrency, cfg.startupRuns, limit),
	}
	return sec, nil
}
