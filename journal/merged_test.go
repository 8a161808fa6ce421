package journal

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// mergedOf interleaves lines of two Logs into a Merged log, the way the
// node's dispatch log is built.
func mergedOf(retention, shardRetention, lines int) (*Merged, []byte) {
	m := NewMerged(retention)
	shards := []*Log{New(shardRetention), New(shardRetention)}
	var all bytes.Buffer
	for i := range lines {
		line := fmt.Appendf(nil, "shard %d line %04d\n", i%2, i)
		_, stored := shards[i%2].AppendLine(line, t0.Add(time.Duration(i)))
		m.Add(stored, t0.Add(time.Duration(i)))
		all.Write(line)
	}
	return m, all.Bytes()
}

func TestMergedReadsLikeALog(t *testing.T) {
	m, all := mergedOf(1<<20, 1<<20, 100)
	if m.Size() != int64(len(all)) || m.Oldest() != 0 || m.Held() != len(all) || !m.ModTime().Equal(t0.Add(99)) {
		t.Fatalf("Size %d Oldest %d Held %d ModTime %v; want %d 0 %d %v", m.Size(), m.Oldest(), m.Held(), m.ModTime(), len(all), len(all), t0.Add(99))
	}
	for _, off := range []int64{0, 1, 17, 18, 500, int64(len(all)) - 1, int64(len(all)), int64(len(all)) + 10} {
		for _, bufSize := range []int{1, 7, 64, 4096} {
			got, start := readAll(m, off, bufSize)
			want := []byte{}
			if off < int64(len(all)) {
				want = all[off:]
			}
			if !bytes.Equal(got, want) || start != off {
				t.Errorf("read from %d in %d-byte reads = %d bytes at %d; want %d at %d", off, bufSize, len(got), start, len(want), off)
			}
		}
	}
}

// Retention drops whole lines from the front, even when the shards' own
// logs dropped theirs long before: the merged log keeps its lines alive.
func TestMergedRetentionKeepsWholeLines(t *testing.T) {
	m, all := mergedOf(1024, 256, 1000)
	oldest := m.Oldest()
	if oldest == 0 || oldest >= int64(len(all)) || (oldest > 0 && all[oldest-1] != '\n') {
		t.Fatalf("Oldest = %d; want the start of a line well into the %d bytes", oldest, len(all))
	}
	if h := m.Held(); h < 1024 || h > 1024+64 {
		t.Errorf("Held = %d; want between the retention and one line more", h)
	}
	got, start := readAll(m, 0, 100)
	if start != oldest || !bytes.Equal(got, all[oldest:]) {
		t.Errorf("read from 0 starts at %d with %d bytes; want %d with %d", start, len(got), oldest, len(all)-int(oldest))
	}
}

func TestMergedNotify(t *testing.T) {
	m := NewMerged(1 << 10)
	ch := m.Notify()
	select {
	case <-ch:
		t.Fatal("closed before Add")
	default:
	}
	_, line := New(1<<10).AppendLine([]byte("x\n"), t0)
	m.Add(line, t0)
	select {
	case <-ch:
	default:
		t.Fatal("not closed by Add")
	}
}

// Readers running beside Add see every line once and whole.
func TestMergedConcurrentReaders(t *testing.T) {
	m := NewMerged(1 << 20)
	src := New(1 << 20)
	const lines = 2000
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var got []byte
			off := int64(0)
			buf := make([]byte, 37)
			for len(got) < lines*10 {
				n, start := m.ReadAt(buf, off)
				if start != off {
					t.Errorf("read at %d moved to %d", off, start)
					return
				}
				got = append(got, buf[:n]...)
				off += int64(n)
			}
			for i := range lines {
				if want := fmt.Sprintf("line %04d\n", i); string(got[i*10:i*10+10]) != want {
					t.Errorf("line %d = %q; want %q", i, got[i*10:i*10+10], want)
					return
				}
			}
		})
	}
	for i := range lines {
		_, line := src.AppendLine(fmt.Appendf(nil, "line %04d\n", i), t0)
		m.Add(line, t0)
	}
	wg.Wait()
}

func BenchmarkMergedAdd(b *testing.B) {
	src := New(1 << 20)
	m := NewMerged(1 << 20)
	line := append(bytes.Repeat([]byte("x"), 700), '\n')
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		_, stored := src.AppendLine(line, t0)
		m.Add(stored, t0)
	}
}

// A cursor that reads slower than lines are added gets every line once:
// either from Next, in order, or handed to its lost function, never both,
// never neither.
func TestCursorSeesEveryLineOnce(t *testing.T) {
	m := NewMerged(200)
	shard := New(1)
	var lost [][]byte
	c := m.Follow(0, func(line []byte) { lost = append(lost, bytes.Clone(line)) })
	defer c.Close()
	var read, added [][]byte
	buf := make([]byte, 50)
	for i := range 500 {
		line := fmt.Appendf(nil, "line %04d\n", i)
		_, stored := shard.AppendLine(line, t0)
		m.Add(stored, t0)
		added = append(added, line)
		if i%7 != 0 {
			continue // the reader falls behind
		}
		n, need := c.Next(buf)
		if need != 0 {
			t.Fatalf("Next(%d bytes) needs %d for a %d-byte line", len(buf), need, len(line))
		}
		for _, l := range bytes.SplitAfter(buf[:n], []byte("\n")) {
			if len(l) > 0 {
				read = append(read, bytes.Clone(l))
			}
		}
	}
	for {
		n, _ := c.Next(buf)
		if n == 0 {
			break
		}
		for _, l := range bytes.SplitAfter(buf[:n], []byte("\n")) {
			if len(l) > 0 {
				read = append(read, bytes.Clone(l))
			}
		}
	}
	if len(lost) == 0 {
		t.Fatal("no line lost; the test wants a reader that falls behind retention")
	}
	seen := map[string]int{}
	for _, l := range append(read, lost...) {
		seen[string(l)]++
	}
	for _, l := range added {
		if seen[string(l)] != 1 {
			t.Errorf("line %q read or lost %d times; want 1", l, seen[string(l)])
		}
	}
	for i := 1; i < len(read); i++ {
		if bytes.Compare(read[i-1], read[i]) >= 0 {
			t.Fatalf("lines read out of order: %q then %q", read[i-1], read[i])
		}
	}
	if c.Offset() != m.Size() {
		t.Errorf("Offset() = %d after reading to the end; want %d", c.Offset(), m.Size())
	}
}

// Next copies whole lines only, and says how long a line is that does not
// fit; a cursor made past what retention dropped says how much it missed.
func TestCursorWholeLinesAndMissed(t *testing.T) {
	m, all := mergedOf(64, 64, 20)
	c := m.Follow(0, func([]byte) {})
	defer c.Close()
	if c.Missed() != m.Oldest() || m.Oldest() == 0 {
		t.Fatalf("Missed() = %d; want Oldest() = %d, above 0", c.Missed(), m.Oldest())
	}
	if n, need := c.Next(make([]byte, 5)); n != 0 || need != len("shard 0 line 0000\n") {
		t.Errorf("Next(5 bytes) = %d, %d; want 0, %d", n, need, len("shard 0 line 0000\n"))
	}
	buf := make([]byte, 30)
	n, _ := c.Next(buf)
	if want := all[m.Oldest() : m.Oldest()+18]; !bytes.Equal(buf[:n], want) {
		t.Errorf("Next(30 bytes) = %q; want the oldest whole line %q", buf[:n], want)
	}
}
