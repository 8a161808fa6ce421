package journal

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)

// readAll reads a Log or a Merged from off to its end in bufSize reads,
// and returns the bytes and the offset the first read started at.
func readAll(l interface {
	ReadAt(p []byte, off int64) (int, int64)
}, off int64, bufSize int) ([]byte, int64) {
	var out []byte
	buf := make([]byte, bufSize)
	first := int64(-1)
	for {
		n, start := l.ReadAt(buf, off)
		if first < 0 {
			first = start
		}
		if n == 0 {
			return out, first
		}
		out = append(out, buf[:n]...)
		off = start + int64(n)
	}
}

func TestOffsetsAreAbsolute(t *testing.T) {
	l := New(1 << 20)
	if got := l.Append([]byte("one\n"), t0); got != 0 {
		t.Fatalf("first Append = %d; want 0", got)
	}
	if got := l.Append([]byte("two\n"), t0.Add(time.Second)); got != 4 {
		t.Fatalf("second Append = %d; want 4", got)
	}
	if l.Size() != 8 || !l.ModTime().Equal(t0.Add(time.Second)) {
		t.Fatalf("Size, ModTime = %d, %v; want 8, %v", l.Size(), l.ModTime(), t0.Add(time.Second))
	}
	for _, tc := range []struct {
		off  int64
		want string
	}{{0, "one\ntwo\n"}, {2, "e\ntwo\n"}, {8, ""}, {100, ""}} {
		got, start := readAll(l, tc.off, 3)
		if string(got) != tc.want || start != tc.off {
			t.Errorf("read from %d = %q at %d; want %q at %d", tc.off, got, start, tc.want, tc.off)
		}
	}
}

func TestRetentionKeepsWholeLines(t *testing.T) {
	l := New(1024)
	var all bytes.Buffer
	for i := range 1000 {
		line := fmt.Appendf(nil, "line %04d\n", i)
		all.Write(line)
		l.Append(line, t0)
	}
	if l.Size() != int64(all.Len()) {
		t.Fatalf("Size() = %d; want %d", l.Size(), all.Len())
	}
	if h := l.Held(); h < 1024 || h > 1024+l.segSize {
		t.Fatalf("Held() = %d; want between 1024 and %d", h, 1024+l.segSize)
	}
	oldest := l.Oldest()
	if oldest == 0 || all.Bytes()[oldest-1] != '\n' {
		t.Fatalf("Oldest() = %d; want a line start after 0", oldest)
	}
	got, start := readAll(l, 0, 100)
	if start != oldest {
		t.Fatalf("read below the oldest offset started at %d; want %d", start, oldest)
	}
	if !bytes.Equal(got, all.Bytes()[oldest:]) {
		t.Fatalf("read below the oldest offset returned %d bytes; want the %d retained", len(got), all.Len()-int(oldest))
	}
}

func TestLongLineIsKeptWhole(t *testing.T) {
	l := New(300)
	l.Append([]byte("short\n"), t0)
	long := append(bytes.Repeat([]byte("x"), 5000), '\n')
	off := l.Append(long, t0)
	got, start := readAll(l, 0, 4096)
	if start != off || !bytes.Equal(got, long) {
		t.Fatalf("read = %d bytes at %d; want the long line of %d bytes at %d", len(got), start, len(long), off)
	}
}

func TestNotifyClosesOnAppend(t *testing.T) {
	l := New(100)
	ch := l.Notify()
	select {
	case <-ch:
		t.Fatal("Notify channel closed before any append")
	default:
	}
	l.Append([]byte("x\n"), t0)
	<-ch
}

// Readers copy concurrently with appends; run with -race. Every reader must
// see each line exactly once, in order, whole.
func TestConcurrentReadersSeeEveryLineOnce(t *testing.T) {
	l := New(1 << 20)
	const lines = 20000
	var wg sync.WaitGroup
	for r := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64+r*37)
			var got bytes.Buffer
			var off int64
			for off < lines*8 {
				wait := l.Notify()
				n, start := l.ReadAt(buf, off)
				if n == 0 {
					<-wait
					continue
				}
				if start != off {
					t.Errorf("reader %d: read at %d moved to %d with nothing evicted", r, off, start)
					return
				}
				got.Write(buf[:n])
				off += int64(n)
			}
			for i := range lines {
				want := fmt.Sprintf("%07d\n", i)
				if line := got.Next(8); string(line) != want {
					t.Errorf("reader %d: line %d = %q; want %q", r, i, line, want)
					return
				}
			}
		}()
	}
	for i := range lines {
		l.Append(fmt.Appendf(nil, "%07d\n", i), t0)
	}
	wg.Wait()
}

func BenchmarkAppend(b *testing.B) {
	l := New(1 << 20)
	line := bytes.Repeat([]byte("x"), 700)
	line = append(line, '\n')
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		l.Append(line, t0)
	}
}

func BenchmarkReadAt(b *testing.B) {
	l := New(1 << 20)
	for range 2000 {
		l.Append(bytes.Repeat([]byte("y"), 511), t0)
		l.Append([]byte("\n"), t0)
	}
	buf := make([]byte, 8192)
	off := l.Oldest()
	b.ReportAllocs()
	for b.Loop() {
		l.ReadAt(buf, off)
	}
}

// A log of a few short lines (an idle shard's) holds about what it was
// given, however large its retention, and never moves bytes it handed out.
func TestSmallLogIsSmall(t *testing.T) {
	l := New(256 << 10)
	held := 0
	var lines [][]byte
	for _, n := range []int{417, 433, 48, 89} {
		_, line := l.AppendLine(append(bytes.Repeat([]byte{byte('a' + len(lines))}, n-1), '\n'), t0)
		lines = append(lines, line)
		held += n
		capacity := 0
		for _, s := range l.segs {
			capacity += cap(s.buf)
		}
		if capacity > 2*held+minSegment {
			t.Errorf("after %d bytes: %d segments of %d bytes in all; want at most %d", held, len(l.segs), capacity, 2*held+minSegment)
		}
	}
	got, _ := readAll(l, 0, 100)
	if len(got) != held {
		t.Errorf("read %d bytes back; want %d", len(got), held)
	}
	for i, line := range lines {
		if want := byte('a' + i); line[0] != want || line[len(line)-1] != '\n' {
			t.Errorf("line %d handed out by AppendLine changed: %q", i, line[:1])
		}
	}
}
