// Package journal is an in-memory append-only log of lines with absolute
// byte offsets and bounded retention, read by offset without ever blocking.
//
// It backs the events and dispatch files: offsets are never reused, the size
// only grows, a read at the end returns nothing at once, and appends never
// wait for readers (a reader holds the lock only while copying). Retention
// drops whole segments from the front, and segments always start at a line
// boundary, so the oldest retained byte is the first byte of a line.
//
// A Merged log interleaves lines that Logs store: the node's dispatch log
// holds the lines of every shard's, in arrival order, without a second copy
// of their bytes (see Merged).
package journal

import (
	"slices"
	"sort"
	"sync"
	"time"
)

// Log is an append-only line log. The zero value is not usable; use New.
type Log struct {
	retention int // bytes kept at least, when more than that was written
	segSize   int

	mu      sync.RWMutex
	segs    []segment // oldest first; the last one takes appends
	held    int       // bytes in segs
	size    int64     // absolute offset of the next append
	modTime time.Time
	notify  chan struct{} // closed and cleared by the next append
}

type segment struct {
	start int64
	buf   []byte
}

// New returns a log that retains about retention bytes: at least the newest
// retention bytes (or the newest line, if longer) and at most retention plus
// one segment.
func New(retention int) *Log {
	if retention < 1 {
		retention = 1
	}
	seg := retention / 4
	seg = max(min(seg, 64<<10), 256)
	return &Log{retention: retention, segSize: seg}
}

// Append adds p, which should hold whole lines, at the end of the log and
// stamps the modification time with now. It returns the offset p starts at.
func (l *Log) Append(p []byte, now time.Time) int64 {
	off, _ := l.AppendLine(p, now)
	return off
}

// AppendLine is Append that also returns the log's own copy of p. Those
// bytes never change and never move, whatever the log does later (it may
// drop them, never reuse them), so a Merged log can hold them.
func (l *Log) AppendLine(p []byte, now time.Time) (int64, []byte) {
	l.mu.Lock()
	off := l.size
	l.room(len(p))
	last := &l.segs[len(l.segs)-1]
	at := len(last.buf)
	last.buf = append(last.buf, p...)
	line := last.buf[at:len(last.buf):len(last.buf)]
	l.held += len(p)
	l.size += int64(len(p))
	l.modTime = now
	for len(l.segs) > 1 && l.held-len(l.segs[0].buf) >= l.retention {
		l.held -= len(l.segs[0].buf)
		l.segs[0] = segment{}
		l.segs = l.segs[1:]
	}
	ch := l.notify
	l.notify = nil
	l.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return off, line
}

// minSegment is the smallest segment: a log with one short line.
const minSegment = 64

// room makes the last segment able to take need more bytes. A new segment
// is as large as what the log already holds (at least the line, at most
// segSize), so segments double while the log fills and then stay at
// segSize: an idle shard's logs (a few lines each) cost about what they
// hold, not a power of two per line, and a busy log allocates rarely.
// Segments are never copied, so that bytes handed out by AppendLine stay
// where they are. A line longer than segSize gets a segment of its own.
func (l *Log) room(need int) {
	if n := len(l.segs); n > 0 && len(l.segs[n-1].buf)+need <= cap(l.segs[n-1].buf) {
		return
	}
	c := max(min(max(l.held, minSegment), l.segSize), need)
	l.segs = append(l.segs, segment{start: l.size, buf: slices.Grow([]byte(nil), c)})
}

// ReadAt copies retained bytes starting at absolute offset off into p and
// returns how many it copied and the offset they start at. A read at or
// past the end copies nothing. A read below the oldest retained offset is
// served from the oldest retained line: start then tells the caller how far
// it was moved. ReadAt never blocks on appends for longer than a copy.
func (l *Log) ReadAt(p []byte, off int64) (n int, start int64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segs) == 0 || off >= l.size {
		return 0, max(off, 0)
	}
	if oldest := l.segs[0].start; off < oldest {
		off = oldest
	}
	start = off
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].start > off }) - 1
	for ; i < len(l.segs) && n < len(p); i++ {
		s := &l.segs[i]
		n += copy(p[n:], s.buf[off+int64(n)-s.start:])
	}
	return n, start
}

// Size returns the absolute offset of the end of the log: the number of
// bytes ever appended.
func (l *Log) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.size
}

// Oldest returns the offset of the oldest retained byte.
func (l *Log) Oldest() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segs) == 0 {
		return l.size
	}
	return l.segs[0].start
}

// ModTime returns the time of the last append, or the zero time.
func (l *Log) ModTime() time.Time {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.modTime
}

// Held returns the number of bytes retained.
func (l *Log) Held() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.held
}

// Notify returns a channel that is closed by the next append, for
// in-process followers that would rather wait than poll.
func (l *Log) Notify() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.notify == nil {
		l.notify = make(chan struct{})
	}
	return l.notify
}
