package main

import (
	"context"
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
}

type logItem struct {
	h slog.Handler
	r slog.Record
}

// newAsyncHandler starts the writer; stop writes what is queued, reports
// how many lines were dropped, and waits for the writer. Records handled
// after stop are dropped.
func newAsyncHandler(next slog.Handler, size int) (h slog.Handler, stop func()) {
	q := &logQueue{ch: make(chan logItem, size), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for {
			select {
			case it := <-q.ch:
				it.h.Handle(context.Background(), it.r)
			case <-q.quit:
				for {
					select {
					case it := <-q.ch:
						it.h.Handle(context.Background(), it.r)
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
		})
	}
	return &asyncHandler{next: next, q: q}, stop
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
