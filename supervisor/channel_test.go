package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

func TestMsgReader(t *testing.T) {
	r := newMsgReader(strings.NewReader(`{"t":"ready","socket":"/s","shard":0}` + "\n" + `{"t":"grant","id":7,"shard":0,"not_before":1700000000000000000}` + "\n" + `{"t":"written","shard":5,"at":1700000000000000001}` + "\n"))
	m, err := r.next()
	if err != nil || m.T != "ready" || m.Socket != "/s" {
		t.Fatalf("next() = %+v, %v", m, err)
	}
	if m, err = r.next(); err != nil || m.T != "grant" || m.ID != 7 || m.NotBefore != 1700000000000000000 {
		t.Fatalf("next() = %+v, %v", m, err)
	}
	if m, err = r.next(); err != nil || m.T != "written" || m.Shard != 5 || m.At != 1700000000000000001 {
		t.Fatalf("next() = %+v, %v", m, err)
	}
	r = newMsgReader(strings.NewReader(`{"shard":3,"s":7,"t":"X","d":{}}` + "\nts=2026 shard=3 event=ready\n"))
	if m, err = r.next(); err != nil || m.T != "dispatch" || string(m.Raw) != `{"shard":3,"s":7,"t":"X","d":{}}`+"\n" {
		t.Fatalf("next() = %+v, %v", m, err)
	}
	if m, err = r.next(); err != nil || m.T != "event" {
		t.Fatalf("next() = %+v, %v", m, err)
	}
	if _, err = r.next(); err != io.EOF {
		t.Fatalf("next() at the end = %v; want EOF", err)
	}
}

func TestMsgReaderGarbage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"hello\n", `"hello"`},
		{`{"t":"frob"}` + "\n", `frob`},
		{`{"t":"ready","extra":1}` + "\n", `extra`},
		{`{"t":"ready"`, `cut short`},
		{strings.Repeat("x", maxMsg+1) + "\n", "over 16777216 bytes"},
		{"\x00\x01\x02\n", `\x00\x01\x02`},
		{`{"t":"session","sid":"SECRET-SESSION","bad":1}` + "\n", "names a session"},
		{`{"t":"written","shard":3}` + "\n", "written message without its shard or time"},
		{`{"t":"written","shard":-1,"at":5}` + "\n", "written message without its shard or time"},
	} {
		_, err := newMsgReader(strings.NewReader(tc.in)).next()
		if !errors.Is(err, ErrGarbage) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("next(%.40q) = %v; want ErrGarbage naming %q", tc.in, err, tc.want)
		}
	}
}

func FuzzMsgReader(f *testing.F) {
	f.Add(`{"t":"status","ready":3,"total":4,"shard":0}` + "\n")
	f.Add("garbage\n")
	f.Fuzz(func(t *testing.T, in string) {
		r := newMsgReader(strings.NewReader(in))
		for range 100 {
			m, err := r.next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrGarbage) {
					t.Fatalf("next() = %v; want EOF or ErrGarbage", err)
				}
				return
			}
			if !msgTypes[m.T] && m.T != "dispatch" && m.T != "event" {
				t.Fatalf("accepted type %q", m.T)
			}
		}
	})
}

// TestLinkEndsWithParent: a child's link is done when the parent's end
// closes (the parent died), and when the parent asks for the shutdown.
func TestLinkEndsWithParent(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(parent *os.File)
		want string
	}{
		{"closed", func(p *os.File) { p.Close() }, "closed the channel"},
		{"shutdown", func(p *os.File) { p.WriteString(`{"t":"shutdown","shard":0}` + "\n") }, "asked for a shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, l := linkPair(t)
			if l.Err() != nil {
				t.Fatalf("Err() = %v before the end", l.Err())
			}
			tc.end(parent)
			<-l.Done()
			if err := l.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Err() = %v; want %q", err, tc.want)
			}
		})
	}
}

// TestLinkFloorsAndWrites: a grant's floor is the shard's
// IdentifyNotBefore by the time the grant runs, a grant without one
// clears it, and IdentifyWritten reaches the parent as a written message.
func TestLinkFloorsAndWrites(t *testing.T) {
	parent, l := linkPair(t)
	r := newMsgReader(parent)
	floor := time.Unix(1700000000, 123456789)
	for _, want := range []time.Time{floor, {}} {
		seen := make(chan time.Time, 1)
		l.Pacer().Request(7, false, func() { seen <- l.IdentifyNotBefore(7) })
		m, err := r.next()
		if err != nil || m.T != "identify" || m.Shard != 7 {
			t.Fatalf("parent read %+v, %v; want the identify of shard 7", m, err)
		}
		g := msg{T: "grant", ID: m.ID}
		if !want.IsZero() {
			g.NotBefore = want.UnixNano()
		}
		(&msgWriter{w: parent}).send(g)
		if got := <-seen; !got.Equal(want) {
			t.Errorf("floor at the grant: %v; want %v", got, want)
		}
	}
	l.IdentifyWritten(7, floor)
	m, err := r.next()
	if err != nil || m.T != "written" || m.Shard != 7 || m.At != floor.UnixNano() {
		t.Fatalf("parent read %+v, %v; want shard 7 written at %d", m, err, floor.UnixNano())
	}
}

// linkPair returns the parent's end of a socketpair and a Link on the
// child's end, both closed when the test ends.
func linkPair(t *testing.T) (*os.File, *Link) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
	l := NewLink(child)
	t.Cleanup(func() {
		l.Close()
		parent.Close()
	})
	return parent, l
}

// TestCopyGap: lines the child's log dropped before the copy read them
// are said by one gap line in their place, with the bytes lost; the
// parent's tree takes it and its shards no longer resume from its points.
func TestCopyGap(t *testing.T) {
	parent, l := linkPair(t)
	src := journal.New(100)
	now := time.Now()
	for i := range 10 {
		src.Append(fmt.Appendf(nil, `{"shard":0,"s":%d,"t":"X","d":{}}`+"\n", i+10), now) // 32 bytes each
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // copy what is there, then return
	l.CopyNamed(ctx, "dispatch", src)
	r := newMsgReader(parent)
	m, err := r.next()
	if err != nil || m.T != "event" || !bytes.Contains(m.Raw, []byte(" event=gap log=dispatch lost_bytes=")) {
		t.Fatalf("first line %q, %v; want the gap line", m.Raw, err)
	}
	gap := bytes.Clone(m.Raw)
	m, err = r.next()
	if err != nil || m.T != "dispatch" {
		t.Fatalf("after the gap: %q, %v; want the retained dispatch lines", m.Raw, err)
	}

	_, tree := treeHarness(t)
	tree.Session("a", 0, core.Session{ID: "A"}, 1)
	tree.Line("a", "dispatch", dispatchLine(0, "1", "READY"))
	if p := tree.ResumePoints("a"); len(p) != 1 {
		t.Fatalf("ResumePoints before the gap = %v", p)
	}
	tree.Line("a", "event", gap)
	if p := tree.ResumePoints("a"); len(p) != 0 {
		t.Fatalf("ResumePoints after the gap = %v; want none", p)
	}
	if m := string(tree.metrics()); !strings.Contains(m, `shardfs_supervisor_gaps_total{child="a"} 1`) {
		t.Errorf("/metrics does not count the gap:\n%s", m)
	}
	if b := make([]byte, 4096); !bytes.Contains(b[:must(tree.events.ReadAt(b, 0))], []byte("event=gap")) {
		t.Fatal("the gap line is not in the parent's /events")
	}
}

func must(n int, _ int64) int { return n }

// TestCopyDispatchGapNamesShards: a child's transit buffer that drops
// lines while the parent does not read names each shard that lost some,
// with the lines and bytes lost; every line the child wrote reaches the
// parent or is counted in a gap line, once; the parent's tree stops that
// shard alone from resuming after a crash, and the others still do.
func TestCopyDispatchGapNamesShards(t *testing.T) {
	parent, l := linkPair(t)
	src := journal.NewMerged(64 << 10)
	logs := map[int]*journal.Log{0: journal.New(TransitShardDispatch), 1: journal.New(TransitShardDispatch)}
	wrote := map[int]int{}
	wroteBytes := map[int]int64{}
	add := func(shard, seq int, typ string) {
		line := dispatchLine(shard, strconv.Itoa(seq), typ)
		if typ == "MESSAGE_CREATE" {
			line = fmt.Appendf(nil, `{"shard":%d,"s":%d,"t":"MESSAGE_CREATE","d":{"content":%q}}`+"\n", shard, seq, strings.Repeat("x", 200))
		}
		_, stored := logs[shard].AppendLine(line, time.Now())
		src.Add(stored, time.Now())
		wrote[shard]++
		wroteBytes[shard] += int64(len(line))
	}
	ctx, cancel := context.WithCancel(context.Background())
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		l.CopyDispatch(ctx, src)
	}()
	_, tree := treeHarness(t)
	tree.Session("a", 0, core.Session{ID: "A"}, 1)
	tree.Session("a", 1, core.Session{ID: "B"}, 1)
	got := map[int]int{}
	gotBytes := map[int]int64{}
	lost := map[int]int{}
	lostBytes := map[int]int64{}
	r := newMsgReader(parent)
	add(0, 1, "READY")
	// Once the parent has it, the copy follows the log.
	if m, err := r.next(); err != nil || m.T != "dispatch" {
		t.Fatalf("parent read %q, %v; want shard 0's READY", m.Raw, err)
	} else {
		tree.Line("a", m.T, m.Raw)
		got[0]++
		gotBytes[0] += int64(len(m.Raw))
	}
	add(1, 1, "READY")
	// 5 MB while the parent reads nothing: far past the socket's buffer
	// and the transit's 64 KiB.
	for seq := 2; seq < 2+20000; seq++ {
		add(1, seq, "MESSAGE_CREATE")
	}
	add(0, 2, "MESSAGE_CREATE")
	add(0, 3, "MESSAGE_CREATE")

	read := make(chan error, 1)
	go func() {
		defer io.Copy(io.Discard, parent) // after a failure too: the copy must not block
		for {
			m, err := r.next()
			if err != nil {
				read <- err
				return
			}
			tree.Line("a", m.T, m.Raw)
			switch m.T {
			case "dispatch":
				shard, _, _ := dispatchShardSeq(m.Raw)
				got[shard]++
				gotBytes[shard] += int64(len(m.Raw))
			case "event":
				shard, ok := eventShard(m.Raw)
				if !ok || !bytes.Contains(m.Raw, []byte(" event=gap log=dispatch ")) {
					read <- fmt.Errorf("an event line that is not a shard's gap: %q", m.Raw)
					return
				}
				var lines int
				var b int64
				if _, err := fmt.Sscanf(string(m.Raw[bytes.Index(m.Raw, []byte("lost_lines=")):]), "lost_lines=%d lost_bytes=%d", &lines, &b); err != nil {
					read <- fmt.Errorf("gap line %q: %v", m.Raw, err)
					return
				}
				lost[shard] += lines
				lostBytes[shard] += b
			}
		}
	}()
	cancel()
	<-copied
	l.Close() // the parent's reader sees the end
	if err := <-read; err != io.EOF {
		t.Fatalf("parent's reader: %v", err)
	}
	if lost[1] == 0 {
		t.Fatalf("shard 1 lost no line; the test wants a transit buffer that overflows (got %d of %d)", got[1], wrote[1])
	}
	for _, shard := range []int{0, 1} {
		if got[shard]+lost[shard] != wrote[shard] || gotBytes[shard]+lostBytes[shard] != wroteBytes[shard] {
			t.Errorf("shard %d: %d lines (%d bytes) copied + %d (%d bytes) in gap lines; want the %d (%d bytes) written", shard, got[shard], gotBytes[shard], lost[shard], lostBytes[shard], wrote[shard], wroteBytes[shard])
		}
	}
	if lost[0] != 0 {
		t.Errorf("shard 0 lost %d lines; want none", lost[0])
	}
	points := tree.ResumePoints("a")
	if len(points) != 1 || points[0].Shard != 0 || points[0].Sequence != 3 {
		t.Errorf("ResumePoints = %v; want shard 0 alone, at 3 (shard 1 has a hole)", points)
	}
	if b := make([]byte, 64<<10); !bytes.Contains(b[:must(tree.shards[1].events.ReadAt(b, 0))], []byte("shard=1 event=gap")) {
		t.Error("the gap line is not in the parent's /1/events")
	}
}

// TestCopyDispatchHugeLine: a dispatch line longer than the channel takes
// is not sent (the parent would stop the child for it): it is counted in
// its shard's gap line, and the lines around it go on.
func TestCopyDispatchHugeLine(t *testing.T) {
	parent, l := linkPair(t)
	src := journal.NewMerged(64 << 20) // keeps all three: the copy starts after them
	huge := fmt.Appendf(nil, `{"shard":1,"s":2,"t":"GUILD_CREATE","d":{"x":"%s"}}`+"\n", strings.Repeat("x", maxMsg))
	for _, line := range [][]byte{dispatchLine(0, "1", "READY"), huge, dispatchLine(0, "2", "MESSAGE_CREATE")} {
		_, stored := journal.New(1).AppendLine(line, time.Now())
		src.Add(stored, time.Now())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // copy what is there, then return
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		l.CopyDispatch(ctx, src)
		l.Close()
	}()
	r := newMsgReader(parent)
	var got []string
	for {
		m, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("parent's reader: %v", err)
		}
		if m.T == "event" {
			_, rest, _ := strings.Cut(string(m.Raw), " ") // past ts=
			got = append(got, "event "+rest)
		} else {
			got = append(got, m.T)
		}
	}
	<-copied
	want := fmt.Sprintf("shard=1 event=gap log=dispatch lost_lines=1 lost_bytes=%d\n", len(huge))
	if len(got) != 3 || got[0] != "dispatch" || got[1] != "event "+want || got[2] != "dispatch" {
		t.Errorf("parent read %q; want shard 0's READY, the gap line %q, shard 0's next line", got, want)
	}
}
