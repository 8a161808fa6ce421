package soak

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildServe builds cmd/shardfs into a test folder.
func buildServe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "shardfs")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/shardfs")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/shardfs: %v\n%s", err, out)
	}
	return bin
}

// The failover soak of issue 12: 3 serve processes, etcd in a child
// process, the simulator, 16 shards, 20 faults (kill -9, SIGSTOP past the
// TTL, a partition from etcd, kill -9 of etcd, drain), each followed by
// every shard READY on exactly one node within TTL + 10 s, never two live
// sessions of one shard, and no frame from a node for a shard it did not
// own. bench runs the same code with 100 faults (go run . -only fleet).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 serve processes and etcd for minutes")
	}
	bin := buildServe(t)
	if help, _ := exec.Command(bin, "serve", "--help").CombinedOutput(); !strings.Contains(string(help), "-etcd") {
		t.Skip("serve has no --etcd flag in this build (issue 12's serve --etcd is not merged yet)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// The bound is the product's claim, which the soak of bench/ holds
	// the tree to; here, on a shared machine that may be loaded, a
	// fault must still converge, within four times it.
	rep, err := Run(ctx, Config{Faults: 20, Serve: bin, Exe: exe, Dir: t.TempDir(), Log: testLog{t}, HangBound: 4 * (Config{}).withDefaults().Bound()})
	if rep != nil {
		t.Logf("soak report:\n%s", rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.OverBound > 0 {
		t.Logf("%d failovers or recoveries took longer than the bound of %v (a loaded machine); bench/'s soak fails on them", rep.OverBound, rep.Config.Bound())
	}
	total := 0
	for _, k := range Kinds {
		if rep.Faults[k] < 4 {
			t.Errorf("%d faults of kind %s; want at least 4 of each", rep.Faults[k], k)
		}
		total += rep.Faults[k]
	}
	if total != 20 {
		t.Errorf("%d faults; want 20", total)
	}
	if rep.WakeFrames == 0 {
		t.Error("no node sent a frame after SIGCONT: the paused nodes never came back to work, so the wake check saw nothing")
	}
	if rep.QuietAtWake == 0 {
		t.Error("no paused node's connection was still open at SIGCONT: the simulator dropped them, so a frame a woken node wrote on an old socket could not have been seen")
	}
	if len(rep.Wakes) != rep.Faults[Pause] {
		t.Errorf("%d woken nodes' deliveries read; want one per pause (%d)", len(rep.Wakes), rep.Faults[Pause])
	}
	lines := 0
	for _, w := range rep.Wakes {
		lines += w.Lines
		if w.Held == 0 {
			t.Errorf("fault %d: %s's lines before its stop named no session: the check of what it delivered after its deadline had nothing to look for", w.Fault, w.Node)
		}
	}
	if lines == 0 {
		t.Error("no woken node appended a dispatch line after its stop: the check of what it delivered after its deadline read nothing")
	}
	// A leave and a join for each kill, pause, partition and drain; one
	// placement at the end of each etcd kill.
	if want := 20 + rep.Faults[Kill] + rep.Faults[Pause] + rep.Faults[Partition] + rep.Faults[Drain]; len(rep.Placements) != want {
		t.Errorf("%d placements recorded; want %d", len(rep.Placements), want)
	}
	if rep.UnknownFrames*100 > rep.Frames {
		t.Errorf("%d of %d frames with no known sender; want under 1%%", rep.UnknownFrames, rep.Frames)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// The soak with a three-member etcd cluster (issue 22, "A real
// cluster"), CI-sized: 3 nodes, 16 shards, one fault of each etcd member
// kind: a member killed, the leader killed (a leader change), a member
// that does not lead partitioned from the others, the leader partitioned
// (a leader change), each held for 2 × TTL. etcd keeps a
// quorum throughout, so nothing may be lost (every shard READY on exactly
// one node at the end of each fault), duplicated (never two live sessions)
// or re-identified (Run records an identify during such a fault as a
// violation). bench runs more of them (go run . -only fleet-cluster).
func TestSoakCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 serve processes and 3 etcd members for a couple of minutes")
	}
	bin := buildServe(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cfg := Config{Faults: len(ClusterKinds), EtcdMembers: 3, Kinds: ClusterKinds, TTL: 10 * time.Second, Serve: bin, Exe: exe, Dir: t.TempDir(), Log: testLog{t},
		Verbose: os.Getenv("SHARDFS_SOAK_VERBOSE") != "", HangBound: 4 * (Config{TTL: 10 * time.Second}).withDefaults().Bound()}
	rep, err := Run(ctx, cfg)
	if rep != nil {
		t.Logf("soak report:\n%s", rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rep.Placements) != len(ClusterKinds) {
		t.Errorf("%d placements recorded; want one at the end of each fault (%d)", len(rep.Placements), len(ClusterKinds))
	}
	for _, k := range ClusterKinds {
		if rep.Faults[k] != 1 {
			t.Errorf("%d faults of kind %s; want 1", rep.Faults[k], k)
		}
		if n := rep.Sessions[k].Identifies; n != 0 {
			t.Errorf("%d identifies during %s faults; want none (etcd kept a quorum)", n, k)
		}
	}
}
