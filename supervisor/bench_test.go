package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

// serveUnix serves root on a unix socket in dir until the benchmark ends.
func serveUnix(b *testing.B, root *fsrv.Dir, path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	srv := &fsrv.Server{Root: root}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	b.Cleanup(func() { cancel(); srv.Close(); l.Close(); <-done })
}

func dialRoot(b *testing.B, path string) p9.File {
	conn, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	cl, err := p9.NewClient(conn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	root, err := cl.Attach("")
	if err != nil {
		b.Fatal(err)
	}
	return root
}

// BenchmarkForwardedRead: one walk+open+read+clunk of /0/state, straight
// from a child's server ("direct") and through the parent's tree, which
// answers it from the state the child pushed ("parent"), and of /0/diag,
// which the parent forwards over its own 9P connection to the child
// ("parent-diag"). Client and servers share the process, so B/op and
// allocs/op count all sides.
func BenchmarkForwardedRead(b *testing.B) {
	dir := b.TempDir()
	childSock := filepath.Join(dir, "child.sock")
	state := []byte("READY\n")
	child := &fsrv.Dir{List: func() []fsrv.File { return nil }}
	shard := fsrv.NewDir("0", &fsrv.Text{Name: "state", Content: func() []byte { return state }},
		&fsrv.Text{Name: "diag", Content: func() []byte { return state }})
	child.List = func() []fsrv.File { return []fsrv.File{shard} }
	serveUnix(b, child, childSock)

	a, _ := ByProcesses(1, 1)
	var reports *Reports
	s := New(Config{Assignment: a, Policy: DefaultPolicy, Launch: func(l Launch, r *Reports) (Process, error) {
		reports = r
		return benchProc{}, nil
	}})
	s.Start()
	reports.Ready(childSock)
	tree := NewTree(TreeConfig{Supervisor: s, Assignment: a, Flavor: core.Discord})
	b.Cleanup(tree.Close)
	tree.State(a.Blocks[0].ID, 1, 0, ShardState{State: "READY", Seq: 1})
	parentSock := filepath.Join(dir, "parent.sock")
	serveUnix(b, tree.Root(), parentSock)

	for _, tc := range []struct{ name, sock, file string }{{"direct", childSock, "state"}, {"parent", parentSock, "state"}, {"parent-diag", parentSock, "diag"}} {
		b.Run(tc.name, func(b *testing.B) {
			root := dialRoot(b, tc.sock)
			buf := make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				_, f, err := root.Walk([]string{"0", tc.file})
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := f.Open(p9.ReadOnly); err != nil {
					b.Fatal(err)
				}
				n, _ := f.ReadAt(buf, 0)
				if string(buf[:n]) != "READY\n" {
					b.Fatalf("read %q", buf[:n])
				}
				f.Close()
			}
		})
	}
}

type benchProc struct{}

func (benchProc) Pid() int               { return 1 }
func (benchProc) Signal(os.Signal) error { return nil }

// BenchmarkCopiedLine is the parent's work for one dispatch line a child
// copies, apart from the read system call: the data stream's reader
// finds the line, and the tree appends it to the shard's log and
// /dispatch and counts its sequence. Lines of about 4 KB, 1,024 shards.
func BenchmarkCopiedLine(b *testing.B) {
	a, err := ByProcesses(1024, 4)
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{Assignment: a, Policy: DefaultPolicy, Launch: func(Launch, *Reports) (Process, error) { return nil, os.ErrInvalid }})
	tree := NewTree(TreeConfig{Supervisor: s, Assignment: a, Flavor: core.Discord})
	b.Cleanup(tree.Close)
	const perRound = 1024
	var stream []byte
	for i := range perRound {
		stream = fmt.Appendf(stream, `{"shard":%d,"s":%d,"t":"MESSAGE_CREATE","d":{"content":"%s"}}`+"\n", i%256, i+1, strings.Repeat("x", 4000))
	}
	b.ReportAllocs()
	// The machine is shared: the process's CPU time, not the wall
	// time, is the parent's cost (GC included).
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	rounds := 0
	for b.Loop() {
		r := newMsgReader(bytes.NewReader(stream))
		for range perRound {
			m, err := r.next()
			if err != nil {
				b.Fatal(err)
			}
			tree.Line("c0", m.T, m.Raw)
		}
		rounds++
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	lines := float64(rounds * perRound)
	b.ReportMetric(float64(cpu.Nanoseconds())/lines, "cpu-ns/line")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/lines, "wall-ns/line")
}
