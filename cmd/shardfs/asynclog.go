package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// asyncHandler hands records to a writer goroutine through a bounded queue
// and drops them when it is full. The core logs while it holds a shard's
// lock, and the 9P reads of that shard wait for the same lock: a stderr
// that stops draining (a paused pager, a full pipe) must cost log lines,
// not a hung tree.
type asyncHandler struct {
	next slog.Handler
	q    *logQueue
}

type logQueue struct {
	ch      chan logItem
	quit    chan struct{}
	done    chan struct{}
	dropped atomic.Uint64
	once    sync.Once
	con     *console // nil: records go straight to their handler
	burst   repeats
}

// logItem is a record for h, or, when h is nil, a status line to draw.
type logItem struct {
	h      slog.Handler
	r      slog.Record
	status string
	final  bool
}

// newAsyncHandler starts the writer; stop writes what is queued, reports
// how many lines were dropped, and waits for the writer. Records handled
// after stop are dropped. con, when not nil, is the writer next writes to:
// status lines go through the same queue, so the writer goroutine alone
// writes to the terminal.
func newAsyncHandler(next slog.Handler, size int, con *console) (h slog.Handler, stop func()) {
	q := &logQueue{ch: make(chan logItem, size), quit: make(chan struct{}), done: make(chan struct{}), con: con}
	go func() {
		defer close(q.done)
		for {
			select {
			case it := <-q.ch:
				q.write(it)
			case <-q.quit:
				for {
					select {
					case it := <-q.ch:
						q.write(it)
					default:
						return
					}
				}
			}
		}
	}()
	stop = func() {
		q.once.Do(func() {
			close(q.quit)
			<-q.done
			if n := q.dropped.Load(); n > 0 {
				r := slog.NewRecord(time.Now(), slog.LevelWarn, "log lines dropped while stderr was not draining", 0)
				r.AddAttrs(slog.Uint64("dropped", n))
				next.Handle(context.Background(), r)
			}
			if q.con != nil {
				q.con.end()
			}
		})
	}
	return &asyncHandler{next: next, q: q}, stop
}

func (q *logQueue) write(it logItem) {
	if it.h == nil {
		q.con.draw(it.status, it.final)
		return
	}
	it.h.Handle(context.Background(), q.burst.shorten(it.r))
}

// status queues a new status line for the terminal; final ends it with a
// newline, so that it stays above what follows. A full queue drops it,
// since the next one replaces it anyway; when a final line is dropped, the
// writer stops drawing the old one.
func (q *logQueue) status(line string, final bool) {
	if q.con == nil {
		return
	}
	select {
	case <-q.quit:
		return
	default:
	}
	select {
	case q.ch <- logItem{status: line, final: final}:
	default:
		if final {
			q.con.dropStatus.Store(true)
		}
	}
}

func (a *asyncHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return a.next.Enabled(ctx, l)
}

func (a *asyncHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case <-a.q.quit:
		a.q.dropped.Add(1)
		return nil
	default:
	}
	select {
	case a.q.ch <- logItem{h: a.next, r: r.Clone()}:
	default:
		a.q.dropped.Add(1)
	}
	return nil
}

func (a *asyncHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &asyncHandler{next: a.next.WithAttrs(attrs), q: a.q}
}

func (a *asyncHandler) WithGroup(name string) slog.Handler {
	return &asyncHandler{next: a.next.WithGroup(name), q: a.q}
}

// console is stderr when it is a terminal: one status line (the startup
// progress) stays at the bottom. Every log line first erases it (\r ESC[K)
// and draws it again after itself, in one write, so that log lines scroll
// above it and never share its line. Only the queue's goroutine writes.
type console struct {
	w io.Writer
	// width, when set, is the terminal's width: a status line that
	// wrapped would leave its first rows behind at every redraw, since
	// ESC[K erases only the row the cursor is on.
	width  func() int
	buf    []byte
	status string // the status line on the screen, without its newline

	dropStatus atomic.Bool // a final status line was dropped: draw none
}

const eraseLine = "\r\033[K"

// Write writes one log line (slog handlers write a record in one call).
func (c *console) Write(p []byte) (int, error) {
	if c.dropStatus.Load() {
		c.status = ""
	}
	if c.status == "" && !c.dropStatus.Load() {
		return c.w.Write(p)
	}
	c.buf = append(append(append(c.buf[:0], eraseLine...), p...), c.status...)
	if _, err := c.w.Write(c.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *console) draw(line string, final bool) {
	if c.width != nil && !final {
		if w := c.width(); w > 1 && len(line) >= w {
			line = line[:w-1] // ASCII: progress writes no other
		}
	}
	c.buf = append(append(c.buf[:0], eraseLine...), line...)
	c.status = line
	if final {
		c.buf = append(c.buf, '\n')
		c.status = ""
	}
	c.w.Write(c.buf)
}

// end leaves the terminal on a fresh line.
func (c *console) end() {
	if c.status != "" {
		c.w.Write([]byte("\n"))
		c.status = ""
	}
}

// repeats shortens a burst of log lines that carry the same long error:
// shards that shared one failed request (discovery, most often) would
// each print its whole text. A line whose err is the one of the line that
// started the burst, within burstWindow of it, says "same as shard N"
// instead. The tree's events keep every shard's full text; this is stderr
// only. Only the queue's goroutine uses it.
type repeats struct {
	err   string
	shard string
	at    time.Time
}

const (
	burstWindow = time.Second
	// minRepeat is the shortest error worth pointing back to: "operator
	// reset" after `reset all` stays as it is.
	minRepeat = 40
)

func (b *repeats) shorten(r slog.Record) slog.Record {
	var err, shard string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			err = a.Value.String()
		case "shard":
			shard = a.Value.String()
		}
		return true
	})
	if len(err) < minRepeat {
		return r
	}
	if err != b.err || r.Time.Sub(b.at) > burstWindow || shard == "" || b.shard == "" {
		b.err, b.shard, b.at = err, shard, r.Time
		return r
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			a = slog.String("err", "same as shard "+b.shard)
		}
		out.AddAttrs(a)
		return true
	})
	return out
}
