package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/core"
)

// ChannelFDVar tells a child which descriptor is its private channel to
// the parent. It carries a number, never a secret.
const ChannelFDVar = "SHARDFS_SUPERVISOR_FD"

// Link is a child's end of its private channel.
type Link struct {
	f        *os.File
	w        *msgWriter
	done     chan struct{} // closed when the parent said shutdown or the channel ended
	err      error         // why, set before done closes
	stopOnce sync.Once

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]waiter
	floors  map[int]time.Time // shard → its last grant's floor (IdentifyNotBefore)
	wg      sync.WaitGroup

	limitMu   sync.Mutex
	limits    *core.Pacer // the node's own pacer: it takes discovery's figures
	lastLimit core.Budget
}

// LinkFromEnv returns the link of a child started by a supervisor, or nil
// when the process was not (ChannelFDVar unset). It unsets the variable,
// so that nothing the child starts inherits it.
func LinkFromEnv() (*Link, error) {
	text, ok := os.LookupEnv(ChannelFDVar)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(ChannelFDVar)
	fd, err := strconv.Atoi(text)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", ChannelFDVar, text)
	}
	// Non-blocking, so that os.NewFile puts it in the poller and Close
	// ends a read in progress.
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("%s=%d: %w", ChannelFDVar, fd, err)
	}
	return NewLink(os.NewFile(uintptr(fd), "supervisor channel")), nil
}

// NewLink runs the child's side of the channel f until Close.
func NewLink(f *os.File) *Link {
	l := &Link{f: f, w: &msgWriter{w: f}, done: make(chan struct{}), waiting: map[uint64]waiter{}, floors: map[int]time.Time{}}
	l.wg.Add(1)
	go l.read()
	return l
}

func (l *Link) read() {
	defer l.wg.Done()
	r := newMsgReader(l.f)
	for {
		m, err := r.next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
				err = errors.New("the parent closed the channel")
			}
			l.stop(err)
			return
		}
		switch m.T {
		case "grant":
			l.mu.Lock()
			w, ok := l.waiting[m.ID]
			delete(l.waiting, m.ID)
			if ok {
				// Before the grant: the identify it lets through
				// asks for its floor.
				if m.NotBefore > 0 {
					l.floors[w.shard] = time.Unix(0, m.NotBefore)
				} else {
					delete(l.floors, w.shard)
				}
			}
			l.mu.Unlock()
			if ok {
				w.grant()
			}
		case "shutdown":
			// Reading goes on, so that the parent never blocks on
			// a full channel during the shutdown.
			l.stop(errors.New("the parent asked for a shutdown"))
		}
	}
}

func (l *Link) stop(err error) {
	l.stopOnce.Do(func() {
		l.err = err
		close(l.done)
	})
}

// Done is closed when the child should shut down: the parent said so, or
// the channel ended (the parent is gone: a child never outlives it).
func (l *Link) Done() <-chan struct{} { return l.done }

// Err says why Done closed.
func (l *Link) Err() error {
	select {
	case <-l.done:
		return l.err
	default:
		return nil
	}
}

// Ready tells the parent the child serves its tree at socket.
func (l *Link) Ready(socket string) error { return l.w.send(msg{T: "ready", Socket: socket}) }

// Session tells the parent of a shard's new session (see
// gateway.Config.OnSession), over the private channel only.
func (l *Link) Session(shard int, s core.Session, seq int64) {
	l.w.send(msg{T: "session", Shard: shard, SID: s.ID, URL: s.ResumeURL, Seq: seq})
}

// Watch reports how many of the node's shards are READY each time that
// changes, until ctx ends.
func (l *Link) Watch(ctx context.Context, n *core.Scheduler) {
	events := n.Events()
	diags := make([]core.Diag, 0, len(n.Plan().Local))
	last := -1
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		diags = n.Snapshot(diags[:0])
		ready := 0
		for _, d := range diags {
			if d.State == core.Ready {
				ready++
			}
		}
		l.sendLimit()
		if ready != last {
			if l.w.send(msg{T: "status", Ready: ready, Total: len(diags)}) != nil {
				return
			}
			last = ready
		}
		select {
		case <-ctx.Done():
			return
		case <-events.Notify():
		case <-tick.C:
		}
	}
}

// LimitsFrom makes the link report p's session start limit (what the
// child's discoveries learnt: its node's own pacer takes them, and grants
// nothing) to the parent whenever it changed, before each identify
// request and as Watch runs, so that the shared pacer enforces the budget
// even when the parent's own discovery failed.
func (l *Link) LimitsFrom(p *core.Pacer) {
	l.limitMu.Lock()
	l.limits = p
	l.limitMu.Unlock()
	l.sendLimit()
}

func (l *Link) sendLimit() {
	l.limitMu.Lock()
	defer l.limitMu.Unlock()
	if l.limits == nil {
		return
	}
	b := l.limits.Budget()
	if b.Total == 0 {
		return // nothing learnt yet
	}
	key := core.Budget{Total: b.Total, Remaining: b.Remaining, ResetAt: b.ResetAt, MaxConcurrency: b.MaxConcurrency}
	if key == l.lastLimit {
		return
	}
	l.lastLimit = key
	var after int64
	if !b.ResetAt.IsZero() {
		after = max(time.Until(b.ResetAt).Milliseconds(), 1)
	}
	l.w.send(msg{T: "limit", Total: b.Total, Remaining: b.Remaining, ResetAfterMs: after, MaxConc: b.MaxConcurrency})
}

// IdentifyNotBefore is gateway.Config.IdentifyNotBefore: the floor the
// parent's last grant for shard carried (see SpacedPacer).
func (l *Link) IdentifyNotBefore(shard int) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.floors[shard]
}

// IdentifyWritten is gateway.Config.IdentifyWritten: it tells the parent
// when an identify of shard was written, so that the next grant of its
// bucket, in any child, is spaced from it.
func (l *Link) IdentifyWritten(shard int, at time.Time) {
	l.w.send(msg{T: "written", Shard: shard, At: at.UnixNano()})
}

// Pacer returns the identify pacer that asks the parent for every slot,
// so that all children share the parent's pacer and budget.
func (l *Link) Pacer() core.IdentifyPacer { return linkPacer{l} }

type linkPacer struct{ l *Link }

type waiter struct {
	shard int
	grant func()
}

// Request asks the parent; the grant comes from the link's reader. A
// request the channel cannot carry waits until the shutdown it brings.
func (p linkPacer) Request(shard int, operator bool, grant func()) (bool, func()) {
	l := p.l
	l.mu.Lock()
	l.nextID++
	id := l.nextID
	l.waiting[id] = waiter{shard, grant}
	l.mu.Unlock()
	l.sendLimit() // what the discovery before this identify learnt comes first
	l.w.send(msg{T: "identify", ID: id, Shard: shard, Operator: operator})
	return false, func() {
		l.mu.Lock()
		_, ok := l.waiting[id]
		delete(l.waiting, id)
		l.mu.Unlock()
		if ok {
			l.w.send(msg{T: "cancel", ID: id})
		}
	}
}

// BudgetWait is zero: the parent's /identify shows the budget.
func (linkPacer) BudgetWait(bool) time.Time { return time.Time{} }

// Close closes the channel and waits for its reader.
func (l *Link) Close() error {
	err := l.f.Close()
	l.wg.Wait()
	return err
}

// Log is a log a child copies to its parent.
type Log interface {
	ReadAt(p []byte, off int64) (n int, start int64)
	Notify() <-chan struct{}
}

// Copy sends src's lines to the parent as they are appended, from the
// start of the log, until ctx ends; then it sends what is left and
// returns. Call it for the node's dispatch and events logs, and end ctx
// only after the node closed, so that the parent has every line the
// child wrote before its sessions were saved.
func (l *Link) Copy(ctx context.Context, src Log) {
	buf := make([]byte, 256<<10)
	var off int64
	for {
		ch := src.Notify()
		for {
			n, start := src.ReadAt(buf, off)
			if n == 0 {
				break
			}
			end := bytes.LastIndexByte(buf[:n], '\n') + 1
			if end == 0 {
				if len(buf) >= maxMsg {
					end = n // a line the parent refuses anyway
				} else {
					buf = make([]byte, min(2*len(buf), maxMsg))
					continue
				}
			}
			if l.w.raw(buf[:end]) != nil {
				return
			}
			off = start + int64(end)
		}
		select {
		case <-ctx.Done():
			if n, _ := src.ReadAt(buf[:1], off); n == 0 {
				return
			}
		case <-ch:
		}
	}
}
