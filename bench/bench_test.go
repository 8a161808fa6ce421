package main

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
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
		breakdown:          true,
		memTLSHeartbeat:    200 * time.Millisecond,
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
		"## 7. Memory per idle shard over TLS", "resident memory per READY shard over TLS, 4 shards",
		"resident memory per READY shard over TLS, 8 shards (shardfs alone)", "Where the memory goes", "crypto/tls",
		"## 8. Dispatch throughput over TLS with zlib-stream", "dispatch events per CPU-second of the client over TLS, shardfs with zlib-stream",
		"## 15. Gateway relay", "MESSAGE_CREATE timestamp to handler p99, 10,000 events/s", "node CPU per event for the second relay client",
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

// TestTLSTrust checks how the comparisons over TLS make the peers trust the
// simulator's certificate: with the trust's environment their handshakes
// succeed and every shard gets READY; without it they fail on the
// certificate, so nothing else (no skipped verification, no pool of their
// own) is what makes them connect.
func TestTLSTrust(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	tr, err := newTrust()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.remove()
	for _, side := range []string{sideDiscordgo, sideDisgo, sideShardfs} {
		t.Run(side, func(t *testing.T) {
			s, err := startSimOver(wire{trust: tr}, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer s.close()
			if !strings.HasPrefix(s.api, "https://") || !strings.HasPrefix(s.gateway, "wss://") {
				t.Fatalf("simulator URLs %s %s; want https:// and wss://", s.api, s.gateway)
			}
			if side != sideShardfs {
				// The shardfs node retries a TLS failure for ever rather
				// than report it, so only the peers are checked this way.
				// disgo retries a failed dial for ever and reports the
				// error only to its logger.
				untrusting := *s
				untrusting.wire = wire{}
				c, err := startClient(side, &untrusting, 2, 2, "-log-errors", "-open-timeout", "3s")
				if err != nil {
					t.Fatal(err)
				}
				err = c.begin(time.Minute)
				c.close()
				if err == nil {
					t.Fatalf("%s without the trust's environment: begin succeeded", side)
				}
				if msg := err.Error() + c.stderr.String(); !strings.Contains(msg, "x509: certificate signed by unknown authority") {
					t.Fatalf("%s without the trust's environment: begin = %v, stderr %q; want an unknown-authority error", side, err, c.stderr)
				}
			}
			c, err := startClient(side, s, 2, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if err := c.begin(time.Minute); err != nil {
				t.Fatalf("%s with the trust's environment: %v", side, err)
			}
			if err := c.waitReady(2, time.Minute); err != nil {
				t.Fatalf("%s over TLS: %v", side, err)
			}
		})
	}
}

func TestOnlyGroups(t *testing.T) {
	names := comparisonNames()
	for _, g := range groups {
		for _, n := range g {
			if !slices.Contains(names, n) {
				t.Errorf("group names %q, which is no comparison", n)
			}
		}
	}
}

// TestMergeReport: a run of some comparisons replaces their sections and
// summary rows in the earlier report and keeps the rest; merging the same
// sections again leaves one line about where they came from.
func TestMergeReport(t *testing.T) {
	old := "# shardfs side by side\n\nProduced by `full` on D1.\n\n## Machine\n\n- CPU\n\n## Summary\n\n| # | measure | shardfs vs peer | target | |\n|---|---|---|---|---|\n" +
		"| 1 | cat | 1.0× | ≥ 1.25× | **not met** |\n| 7 | old tls | 0.5 | ≤ 0.33 | **not met** |\n\n" +
		"## 1. 9P\n\nnine\n\n## 7. Memory over TLS\n\nold seven\n\n\nOne full run of the harness took 20m of wall time.\n"
	fresh := "# shardfs side by side\n\nProduced by `only` on D2.\n\n## Machine\n\n- CPU\n\n## Summary\n\n| # | measure | shardfs vs peer | target | |\n|---|---|---|---|---|\n" +
		"| 7 | new tls | 0.3 | ≤ 0.33 | **met** |\n| 8 | zlib | 5× | ≥ 2× | **met** |\n\n## 7. Memory over TLS\n\nnew seven\n\n## 8. Dispatch over TLS\n\neight\n\n"
	want := "# shardfs side by side\n\nProduced by `full` on D1.\n\nMerged: sections 7, 8 from `only` on D2.\n\n## Machine\n\n- CPU\n\n## Summary\n\n| # | measure | shardfs vs peer | target | |\n|---|---|---|---|---|\n" +
		"| 1 | cat | 1.0× | ≥ 1.25× | **not met** |\n| 7 | new tls | 0.3 | ≤ 0.33 | **met** |\n| 8 | zlib | 5× | ≥ 2× | **met** |\n\n" +
		"## 1. 9P\n\nnine\n\n## 7. Memory over TLS\n\nnew seven\n\n## 8. Dispatch over TLS\n\neight\n\n\nOne full run of the harness took 20m of wall time.\n"
	got := mergeReport(old, fresh, []int{7, 8}, "Merged: sections 7, 8 from `only` on D2.")
	if got != want {
		t.Fatalf("mergeReport =\n%s\nwant\n%s", got, want)
	}
	again := mergeReport(got, fresh, []int{7, 8}, "Merged: sections 7, 8 from `only` on D3.")
	if strings.Count(again, "Merged: ") != 1 || !strings.Contains(again, "on D3.") {
		t.Errorf("merging again:\n%s\nwant one Merged line, about D3", again)
	}
	if strings.Replace(again, "D3", "D2", 1) != want {
		t.Errorf("merging again changed more than the Merged line:\n%s", again)
	}
}

func TestBreakdownText(t *testing.T) {
	by := map[string]float64{
		"crypto/tls:record-buffer": 1800, "crypto/tls:keys": 1900, "crypto/tls:Conn": 900,
		"shardfs/gateway": 1500, "time": 100, "net": 50, unusedKey: 4000,
	}
	got := breakdownText(by, 2)
	want := "6,250 B in all: crypto/tls 4,600 B (keys 1,900 B, record buffer 1,800 B, Conn 900 B), shardfs/gateway 1,500 B, other 150 B; and 4,000 B of room in the heap's in-use spans that no object takes"
	if got != want {
		t.Errorf("breakdownText =\n%s\nwant\n%s", got, want)
	}
	for fn, want := range map[string]string{
		"crypto/tls.Client":                   "crypto/tls:Conn",
		"crypto/tls.(*Conn).readFromUntil":    "crypto/tls:record-buffer",
		"crypto/tls.(*Conn).readRecordOrCCS":  "crypto/tls:handshake-buffer",
		"crypto/tls.aeadAESGCMTLS13":          "crypto/tls:keys",
		"crypto/tls.(*Conn).handshakeContext": "crypto/tls:other",
	} {
		if got := tlsPart(fn); got != want {
			t.Errorf("tlsPart(%q) = %q; want %q", fn, got, want)
		}
	}
	if got := funcPackage("github.com/gorilla/websocket.(*Conn).NextReader"); got != "github.com/gorilla/websocket" {
		t.Errorf("funcPackage = %q", got)
	}
}
