package supervisor

import (
	"errors"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

// Lines that a reader would take for another shard than the check read
// are dropped (the re-attack on issue 23): a dispatch line with a second
// top-level "shard" key (encoding/json takes the last), events lines with
// a tab before shard=, a second shard key, or no ts= first. The child's
// own lines, as the logs write them (quoted values, gap lines, a READY
// whose payload has its own "shard"), go through.
func TestLineCheckParsesWhatReadersRead(t *testing.T) {
	_, tree := treeHarness(t)
	var own, other int
	for id, sl := range tree.shards {
		if tree.cfg.Assignment.Blocks[sl.owner].ID == "b" {
			other = id
		} else {
			own = id
		}
	}
	o, x := strconv.Itoa(own), strconv.Itoa(other)
	ts := "ts=2026-11-30T07:00:00.000Z"
	now := time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)
	for _, line := range []string{
		`{"shard":` + o + `,"s":999996,"t":"X","d":{},"shard":` + x + `}` + "\n",
		`{"shard":` + o + `,"s":999997,"t":"X","d":{},"sh\u0061rd":` + x + `}` + "\n",
		`{"shard":` + o + `,"s":999998,"t":"X","d":{},"SHARD":` + x + `}` + "\n",
	} {
		tree.Line("a", "dispatch", []byte(line))
	}
	for _, line := range []string{
		ts + "\tshard=" + x + " event=fatal code=4004 FORGED=tab\n",
		ts + " shard=" + o + " event=ready shard=" + x + " FORGED=dup\n",
		"event=fatal code=4004 FORGED=nots\n",
		ts + " event=fatal shard=" + x + " FORGED=late\n",
		ts + " shard=" + o + "  event=fatal FORGED=twospaces\n",
	} {
		tree.Line("a", "event", []byte(line))
	}
	tree.Line("a", "dispatch", []byte(`{"shard":`+o+`,"s":5,"t":"READY","d":{"shard":[`+o+`,2],"v":10}}`+"\n"))
	tree.Line("a", "event", []byte(ts+" shard="+o+` event=rejected reason="a \"quoted\" shard=`+x+` value" own=1`+"\n"))
	tree.Line("a", "event", gapLine(now, "events", 10))
	tree.Line("a", "event", shardGapLine(now, own, &shardLoss{lines: 2, bytes: 20}))
	read := func(l interface {
		Size() int64
		ReadAt([]byte, int64) (int, int64)
	}) string {
		buf := make([]byte, l.Size())
		n, _ := l.ReadAt(buf, 0)
		return string(buf[:n])
	}
	ev, disp := read(tree.events), read(tree.dispatch)
	if strings.Contains(ev, "FORGED") || !strings.Contains(ev, "own=1") || strings.Count(ev, "event=gap") != 2 {
		t.Errorf("/events:\n%s\nwant no FORGED line, the child's own line and its two gap lines", ev)
	}
	if strings.Contains(disp, "99999") || !strings.Contains(disp, `"READY"`) {
		t.Errorf("/dispatch:\n%s\nwant no line with a second shard key, the READY kept", disp)
	}
}
