package journal

import (
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Merged is an append-only log of lines stored by Logs (AppendLine): it
// keeps, in the order they were added, references to their bytes, not
// copies, and otherwise behaves like a Log: absolute offsets, a size that
// only grows, retention of about retention bytes dropped whole lines at a
// time from the front, reads that never block.
//
// The node's dispatch log is the Merged view of every shard's: a line costs
// its bytes once, in its shard's log, and a 32-byte reference here. A line
// its shard's log has dropped stays alive while a reference to it is
// retained here, which bounds what it can cost: only a shard whose share
// of this log exceeds its own retention can leave lines behind, so at most
// this log's retention plus one segment per such shard.
type Merged struct {
	retention int

	mu      sync.RWMutex
	lines   []mergedLine // retained lines, oldest first, from head
	head    int
	held    int   // bytes of the retained lines
	size    int64 // absolute offset of the next line
	modTime time.Time
	notify  chan struct{}
	cursors []*Cursor
}

type mergedLine struct {
	start int64
	b     []byte
}

// NewMerged returns a merged log that retains at least the newest
// retention bytes (or the newest line, if longer) and at most retention
// plus one line.
func NewMerged(retention int) *Merged {
	return &Merged{retention: max(retention, 1)}
}

// Add appends a line, which must not change afterwards (AppendLine's), and
// stamps the modification time with now. It returns the line's offset.
func (m *Merged) Add(line []byte, now time.Time) int64 {
	m.mu.Lock()
	off := m.size
	m.lines = append(m.lines, mergedLine{start: off, b: line})
	m.held += len(line)
	m.size += int64(len(line))
	m.modTime = now
	for len(m.lines)-m.head > 1 && m.held-len(m.lines[m.head].b) >= m.retention {
		dropped := m.lines[m.head]
		for _, c := range m.cursors {
			if c.off.Load() <= dropped.start {
				c.lost(dropped.b)
			}
		}
		m.held -= len(dropped.b)
		m.lines[m.head] = mergedLine{}
		m.head++
	}
	if m.head > 64 && m.head > len(m.lines)/2 {
		m.lines = m.lines[:copy(m.lines, m.lines[m.head:])]
		clear(m.lines[len(m.lines):cap(m.lines)])
		m.head = 0
	}
	ch := m.notify
	m.notify = nil
	m.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return off
}

// ReadAt is Log.ReadAt: it copies retained bytes from absolute offset off
// into p, and returns how many and the offset they start at, moved forward
// to the oldest retained line when off is below it.
func (m *Merged) ReadAt(p []byte, off int64) (n int, start int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	live := m.lines[m.head:]
	if len(live) == 0 || off >= m.size {
		return 0, max(off, 0)
	}
	off = max(off, live[0].start)
	start = off
	i := sort.Search(len(live), func(i int) bool { return live[i].start > off }) - 1
	for ; i < len(live) && n < len(p); i++ {
		l := &live[i]
		n += copy(p[n:], l.b[off+int64(n)-l.start:])
	}
	return n, start
}

// Size returns the absolute offset of the end of the log.
func (m *Merged) Size() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.size
}

// Oldest returns the offset of the oldest retained byte.
func (m *Merged) Oldest() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.head == len(m.lines) {
		return m.size
	}
	return m.lines[m.head].start
}

// ModTime returns the time of the last Add, or the zero time.
func (m *Merged) ModTime() time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.modTime
}

// Held returns the number of bytes retained.
func (m *Merged) Held() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.held
}

// Notify returns a channel that is closed by the next Add.
func (m *Merged) Notify() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.notify == nil {
		m.notify = make(chan struct{})
	}
	return m.notify
}

// A Cursor reads a Merged log in order for one reader that must know what
// retention took from it before it read it: a supervised child's copy of
// its dispatch log, whose parent names the shards whose lines were lost.
type Cursor struct {
	m      *Merged
	off    atomic.Int64 // the next line to read; only Next moves it
	missed int64
	lost   func(line []byte)
}

// Follow returns a cursor at offset from (a line's start). lost gets each
// line that retention drops before the cursor read it, before Next returns
// any line after it; it runs under the log's lock, so it must be quick
// and must not use the log. Close the cursor when done.
func (m *Merged) Follow(from int64, lost func(line []byte)) *Cursor {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &Cursor{m: m, lost: lost}
	oldest := m.size
	if m.head < len(m.lines) {
		oldest = m.lines[m.head].start
	}
	c.missed = max(oldest-from, 0)
	c.off.Store(max(from, oldest))
	m.cursors = append(m.cursors, c)
	return c
}

// Missed returns how many bytes after from the log had already dropped
// when the cursor was made: lost unseen by the lost function.
func (c *Cursor) Missed() int64 { return c.missed }

// Next copies whole lines from the cursor into p and moves past them. When
// the next line alone is longer than p it copies nothing and returns the
// line's length as need.
func (c *Cursor) Next(p []byte) (n, need int) {
	m := c.m
	m.mu.RLock()
	defer m.mu.RUnlock()
	live := m.lines[m.head:]
	off := c.off.Load()
	// Lines below the oldest were handed to lost by Add.
	i := sort.Search(len(live), func(i int) bool { return live[i].start >= off })
	for ; i < len(live); i++ {
		b := live[i].b
		if n+len(b) > len(p) {
			if n == 0 {
				need = len(b)
			}
			break
		}
		n += copy(p[n:], b)
		off = live[i].start + int64(len(b))
	}
	c.off.Store(off)
	return n, need
}

// Offset returns the offset of the next line the cursor reads.
func (c *Cursor) Offset() int64 { return c.off.Load() }

// Close detaches the cursor from its log.
func (c *Cursor) Close() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cursors = slices.DeleteFunc(m.cursors, func(x *Cursor) bool { return x == c })
}
