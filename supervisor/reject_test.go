package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
)

// fakeChild is a child's tree that refuses every write to /ctl, /0/ctl
// and /0/send, logging the refusal to its events as the core does and
// copying the line to the parent, as the channel does, on another
// goroutine.
type fakeChild struct {
	tree   *Tree
	events *journal.Log
	shard0 *journal.Log
}

func (c *fakeChild) refuse(shard int, line string) error {
	now := time.Now()
	b := eventLine(now, shard, "rejected", "cmd", line, "err", "the child's own reason for "+line)
	if shard >= 0 {
		c.shard0.Append(b, now)
	}
	c.events.Append(b, now)
	go c.tree.Line("a", "event", b)
	return fmt.Errorf("%w: the child's own reason for %s", fs.ErrInvalid, line)
}

func serveChild(t *testing.T, root *fsrv.Dir, path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &fsrv.Server{Root: root}
	done := make(chan struct{})
	go func() { srv.Serve(context.Background(), l); close(done) }()
	t.Cleanup(func() { srv.Close(); l.Close(); <-done })
}

// rejected returns the event=rejected lines of a log.
func rejected(l *journal.Log) []string {
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	var out []string
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if strings.Contains(line, " event=rejected ") {
			out = append(out, line)
		}
	}
	return out
}

// Every refusal of supervise's parent says why, in its error (which a
// 9P2000 client reads) and in the events log beside the file (which a
// 9P2000.L client, whose error is EINVAL alone, reads): its own refusals
// as node-level lines (no shard key) or the shard's; a child's with the
// child's reason, once, the child's own line copied over.
func TestParentRefusalsSayWhy(t *testing.T) {
	h, tree := treeHarness(t)
	h.s.Start()
	defer closeHarness(h)
	child := &fakeChild{tree: tree, events: journal.New(1 << 16), shard0: journal.New(1 << 16)}
	sock := filepath.Join(t.TempDir(), "a.sock")
	serveChild(t, fsrv.NewDir("/",
		&fsrv.Ctl{Name: "ctl", Handle: func(l string) error { return child.refuse(-1, l) }},
		&fsrv.LogFile{Name: "events", Source: child.events},
		fsrv.NewDir("0",
			&fsrv.Ctl{Name: "ctl", Handle: func(l string) error { return child.refuse(0, l) }},
			&fsrv.Ctl{Name: "send", Handle: func(l string) error { return child.refuse(0, l) }},
			&fsrv.LogFile{Name: "events", Source: child.shard0},
		),
	), sock)
	h.last("a").reports.Ready(sock)
	h.wantState("a", Running)

	file := func(dir fsrv.File, name string) fsrv.File {
		for _, f := range dir.(*fsrv.Dir).List() {
			if fsrv.FileName(f) == name {
				return f
			}
		}
		t.Fatalf("no %s", name)
		return nil
	}
	ctl := func(path string) func(string) error {
		f := file(tree.Root(), path)
		if _, ok := f.(*fsrv.Dir); ok {
			f = file(f, "ctl")
		}
		return f.(*fsrv.Ctl).Handle
	}
	send0 := file(file(tree.Root(), "0"), "send").(*fsrv.Ctl).Handle
	for _, tc := range []struct {
		name   string
		write  func(string) error
		line   string
		kind   error
		reason string
		log    *journal.Log
		shard  string // the shard key of the events line, "" for none
	}{
		{"unknown", ctl("ctl"), "frob", fs.ErrInvalid, `"frob": unknown command; usage: reset all|ID... |`, tree.events, ""},
		{"restart usage", ctl("ctl"), "restart", fs.ErrInvalid, "usage: restart ID|all", tree.events, ""},
		{"no child", ctl("ctl"), "restart nope", fs.ErrInvalid, `"nope"`, tree.events, ""},
		{"reshard", ctl("ctl"), "reshard 16", fsrv.ErrBusy, "supervise does not move to a larger plan yet", tree.events, ""},
		{"no shard", ctl("ctl"), "reset 99", fs.ErrInvalid, "shard 99 is not in any child's block", tree.events, ""},
		{"child starting", ctl("ctl"), "reset 5", fsrv.ErrBusy, "child b is starting", tree.events, ""},
		{"shard of a child starting", ctl("5"), "reset", fsrv.ErrBusy, "child b is starting", tree.shards[5].events, "shard=5 "},
		{"child refuses node command", ctl("ctl"), "stop 0", fs.ErrInvalid, "child a: the child's own reason for stop 0", tree.events, ""},
		{"child refuses shard command", ctl("0"), "identify", fs.ErrInvalid, "child a: the child's own reason for identify", tree.shards[0].events, "shard=0 "},
		{"child refuses send", send0, `{"op":3}`, fs.ErrInvalid, `child a: the child's own reason for {"op":3}`, tree.shards[0].events, "shard=0 "},
	} {
		before := len(rejected(tc.log))
		err := tc.write(tc.line)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: write %q = %v; want %v saying %q", tc.name, tc.line, err, tc.kind, tc.reason)
			continue
		}
		lines := rejected(tc.log)[before:]
		if len(lines) != 1 {
			t.Errorf("%s: %d new rejected lines %q; want 1", tc.name, len(lines), lines)
			continue
		}
		want := fmt.Sprintf(" %sevent=rejected cmd=", tc.shard)
		if !strings.Contains(lines[0], want) || (tc.shard == "" && strings.Contains(lines[0], "shard=")) {
			t.Errorf("%s: line %q; want %q in it", tc.name, lines[0], want)
		}
		// The line gives the reason without the writer's words (package
		// refusal): an unknown word and a quoted argument are left out.
		logged := map[string]string{
			"unknown":  `cmd=? len=4 err=""...": unknown command; usage: reset all|ID... |`,
			"no child": `cmd=restart len=12 err="no such child: "..."`,
		}[tc.name]
		if logged == "" {
			logged = strings.TrimPrefix(tc.reason, "child a: ")
		}
		if !strings.Contains(strings.ReplaceAll(lines[0], `\"`, `"`), logged) {
			t.Errorf("%s: line %q does not give the reason %q", tc.name, lines[0], logged)
		}
	}
}

// Junk written to the parent's ctl without pause costs a few lines: ten
// a minute, the rest summed up in one line.
func TestParentRefusalsBounded(t *testing.T) {
	h, tree := treeHarness(t)
	h.s.Start()
	defer closeHarness(h)
	for range 50 {
		if err := tree.ctl("frob"); err == nil {
			t.Fatal("frob accepted")
		}
	}
	if n := len(rejected(tree.events)); n != refusal.Burst {
		t.Fatalf("%d rejected lines after 50 refusals; want %d", n, refusal.Burst)
	}
	h.clk.Advance(refusal.Window)
	tree.ctl("frob")
	buf := make([]byte, tree.events.Size())
	n, _ := tree.events.ReadAt(buf, 0)
	if !strings.Contains(string(buf[:n]), " event=rejected-suppressed suppressed=40 window=1m0s\n") {
		t.Errorf("no summary of the 40 suppressed refusals:\n%s", buf[:n])
	}
}

// The parent's /ctl usage lists every command it takes, and each of its
// lines is a command it takes.
func TestParentUsage(t *testing.T) {
	h, tree := treeHarness(t)
	h.s.Start()
	defer closeHarness(h)
	inst := strings.NewReplacer("all|ID...", "all", "ID|all", "nope", "DURATION", "30s")
	for _, line := range strings.Split(strings.TrimSpace(Usage), "\n") {
		err := tree.command(inst.Replace(line))
		if err != nil && (errors.Is(err, core.ErrUsage) || strings.Contains(err.Error(), "usage")) {
			t.Errorf("usage line %q: %v", line, err)
		}
	}
	for v := core.VerbReset; v.String() != "unknown"; v++ {
		if !strings.Contains("\n"+Usage, "\n"+v.String()+" ") {
			t.Errorf("the core's %s is not in the parent's usage", v)
		}
	}
	if !strings.Contains(Usage, "\nrestart ") {
		t.Error("restart is not in the parent's usage")
	}
}
