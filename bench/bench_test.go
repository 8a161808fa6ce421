package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the roles the harness re-executes
// itself in.
func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// smokeConfig shrinks every comparison to a few shards and fractions of a
// second, so that the whole harness runs end to end in CI.
func smokeConfig() config {
	return config{
		runs:               1,
		startupRuns:        1,
		command:            "go test",
		ninepDuration:      100 * time.Millisecond,
		diodloadSecs:       1,
		memShards:          4,
		memBigShards:       8,
		memBigRuns:         1,
		memHeartbeat:       200 * time.Millisecond,
		dispatchShards:     2,
		dispatchPerShard:   50,
		startupShards:      4, // one round: nobody waits for a 5 s window
		startupConcurrency: 4,
		startupWindow:      5 * time.Second,
		recoveryShards:     4,
		recoveryTraffic:    5,
		recoverySettle:     300 * time.Millisecond,
		observerShards:     4,
		observerStatus:     2,
		observerEvents:     2,
		observerInterval:   20 * time.Millisecond,
		observerPhase:      300 * time.Millisecond,
		observerFlapRate:   20,
	}
}

// TestHarness runs every comparison with tiny sizes and checks that each
// produced its rows. Targets are not judged at this size. diod is needed
// for the 9P comparison: without it, the comparison is skipped, unless
// CI=true, where it fails.
func TestHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes")
	}
	cfg := smokeConfig()
	cfg.requireDiod = os.Getenv("CI") == "true"
	if _, err := exec.LookPath("diod"); err != nil && !cfg.requireDiod {
		t.Log("diod is not installed: the 9P comparison is skipped")
	}
	var log bytes.Buffer
	report, err := run(cfg, &log)
	t.Log(log.String())
	if err != nil {
		t.Fatalf("run: %v\n%s", err, report)
	}
	for _, want := range []string{
		"## Machine", "## Summary",
		"## 2. Memory per idle shard", "resident memory per READY shard, 4 shards",
		"## 3. Dispatch throughput", "dispatch events per CPU-second",
		"## 4. Startup pacing", "identifies refused",
		"## 5. Mass recovery", "dispatch events lost",
		"## 6. Observer load", "event-handling latency p99",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := exec.LookPath("diod"); err == nil && !strings.Contains(report, "cat 0/state") {
		t.Errorf("diod is installed but the report has no 9P rows")
	}
	if t.Failed() {
		t.Log(report)
	}
}

func TestHist(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 500e3}, {0.99, 990e3}, {1, 1000e3}} {
		if got := h.quantile(c.q); got < c.want*0.97 || got > c.want*1.03 {
			t.Errorf("quantile(%v) = %v; want %v ± 3%%", c.q, got, c.want)
		}
	}
	for ns := uint64(0); ns < 1<<20; ns = ns*3/2 + 1 {
		if mid := bucketMid(bucketOf(ns)); mid < float64(ns)*0.96-1 || mid > float64(ns)*1.04+1 {
			t.Errorf("bucketMid(bucketOf(%d)) = %v", ns, mid)
		}
	}
}

func TestCell(t *testing.T) {
	if got, want := cell([]float64{3, 1, 2, 10, 4}, 0), "3 (1–10, n=5)"; got != want {
		t.Errorf("cell = %q; want %q", got, want)
	}
	if got, want := num(1234567.891, 1), "1,234,567.9"; got != want {
		t.Errorf("num = %q; want %q", got, want)
	}
}
