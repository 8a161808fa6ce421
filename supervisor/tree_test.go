package supervisor

import (
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

func treeHarness(t *testing.T) (*harness, *Tree) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	tree := NewTree(TreeConfig{Supervisor: h.s, Assignment: h.s.cfg.Assignment, Flavor: core.Discord, Clock: h.clk})
	t.Cleanup(tree.Close)
	return h, tree
}

func dispatchLine(shard int, seq, typ string) []byte {
	return []byte(`{"shard":` + strconv.Itoa(shard) + `,"s":` + seq + `,"t":"` + typ + `","d":{}}` + "\n")
}

// TestResumePoints: a session becomes resumable once the parent has both
// the child's report and the READY line, in either order, and resumes at
// the last sequence the parent's log holds.
func TestResumePoints(t *testing.T) {
	_, tree := treeHarness(t)
	a := core.Session{ID: "A", ResumeURL: "wss://a"}
	b := core.Session{ID: "B", ResumeURL: "wss://b"}
	tree.Session("a", 0, a, 1) // report first
	if p := tree.ResumePoints("a"); len(p) != 0 {
		t.Fatalf("ResumePoints before the READY line = %v", p)
	}
	tree.Line("a", "dispatch", dispatchLine(0, "1", "READY"))
	tree.Line("a", "dispatch", dispatchLine(0, "2", "MESSAGE_CREATE"))
	tree.Line("a", "dispatch", dispatchLine(1, "1", "READY")) // line first
	tree.Session("a", 1, b, 1)
	tree.Line("a", "dispatch", dispatchLine(1, "null", "RESUMED"))
	want := []ResumePoint{{0, a, 2}, {1, b, 1}}
	if got := tree.ResumePoints("a"); !slices.Equal(got, want) {
		t.Fatalf("ResumePoints = %v; want %v", got, want)
	}
	// A new session's READY line without its report: nothing to resume.
	tree.Line("a", "dispatch", dispatchLine(0, "1", "READY"))
	if got := tree.ResumePoints("a"); !slices.Equal(got, want[1:]) {
		t.Fatalf("ResumePoints = %v; want %v", got, want[1:])
	}
	// Another child cannot speak for a's shards.
	tree.Line("b", "dispatch", dispatchLine(1, "9", "MESSAGE_CREATE"))
	tree.Session("b", 1, a, 1)
	if got := tree.ResumePoints("a"); !slices.Equal(got, want[1:]) {
		t.Fatalf("after b's lines ResumePoints = %v; want %v", got, want[1:])
	}
	if n := tree.Dispatches().Size(); n == 0 {
		t.Fatal("no /dispatch")
	}
	if s := string(tree.status()); !strings.Contains(s, "0 ASSIGNED 1 0 0\n") || !strings.Contains(s, "1 ASSIGNED 1 0 0\n") {
		t.Fatalf("status with no child running = %q", s)
	}
}

// TestTreeCtl: the parent's /ctl refuses what it cannot route, naming it.
func TestTreeCtl(t *testing.T) {
	h, tree := treeHarness(t)
	h.s.Start()
	for _, tc := range []struct {
		line string
		kind error
		want string
	}{
		{"frob", fs.ErrInvalid, "frob"},
		{"restart nope", fs.ErrInvalid, `"nope"`},
		{"restart", fs.ErrInvalid, "restart ID|all"},
		{"reshard 16", fsrv.ErrBusy, "supervise does not move to a larger plan yet"},
		{"reset 99", fs.ErrInvalid, "shard 99"},
		{"reset 5", fsrv.ErrBusy, "child b is starting"},
		{"stop all", fsrv.ErrBusy, "child a is starting"},
	} {
		err := tree.ctl(tc.line)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ctl(%q) = %v; want %v naming %q", tc.line, err, tc.kind, tc.want)
		}
	}
	if err := tree.ctl("restart a"); err != nil {
		t.Fatalf("restart a = %v", err)
	}
	h.wantState("a", Stopping)
	h.last("a").reports.Exited(nil)
	h.wantState("a", Starting)
	if got := string(tree.children()); got != "a starting 103 1 2 0-3 exit:0 0.0s\nb starting 102 0 1 4-7 none 0.0s\n" {
		t.Errorf("children = %q", got)
	}
	closeHarness(h)
}

func TestDispatchShardSeq(t *testing.T) {
	for _, tc := range []struct {
		line       string
		shard      int
		seq        int64
		ok, others bool
	}{
		{`{"shard":12,"s":345,"t":"X","d":{}}`, 12, 345, true, false},
		{`{"shard":3,"s":null,"t":"RESUMED","d":{}}`, 3, -1, true, false},
		{`{"shard":x,"s":1}`, 0, 0, false, false},
	} {
		shard, seq, ok := dispatchShardSeq([]byte(tc.line))
		if shard != tc.shard || seq != tc.seq || ok != tc.ok {
			t.Errorf("dispatchShardSeq(%s) = %d %d %v; want %d %d %v", tc.line, shard, seq, ok, tc.shard, tc.seq, tc.ok)
		}
	}
	if n, ok := eventShard([]byte("ts=2026 shard=17 event=ready\n")); n != 17 || !ok {
		t.Errorf("eventShard = %d %v", n, ok)
	}
}

// A child's events line about a shard outside its block is dropped, and
// never reaches the parent's /events (the attack on issue 23 forged a
// FATAL 4004 for another child's shard); its own shard's line and a node
// line (no shard) go through.
func TestEventLineOutsideBlock(t *testing.T) {
	_, tree := treeHarness(t)
	var other int
	for id, sl := range tree.shards {
		if tree.cfg.Assignment.Blocks[sl.owner].ID == "b" {
			other = id
		}
	}
	forged := []byte("ts=2026-11-30T07:00:00.000Z shard=" + strconv.Itoa(other) + " event=fatal code=4004 FORGED=1\n")
	tree.Line("a", "event", forged)
	tree.Line("a", "event", []byte("ts=2026-11-30T07:00:00.000Z shard=0 event=ready own=1\n"))
	tree.Line("a", "event", []byte("ts=2026-11-30T07:00:00.000Z event=startup node=1\n"))
	buf := make([]byte, tree.events.Size())
	n, _ := tree.events.ReadAt(buf, 0)
	ev := string(buf[:n])
	if strings.Contains(ev, "FORGED") || !strings.Contains(ev, "own=1") || !strings.Contains(ev, "node=1") {
		t.Errorf("/events after a forged line for shard %d:\n%s\nwant it dropped, the child's own lines kept", other, ev)
	}
}
