package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// ChannelFDVar tells a child which descriptor is its private channel to
// the parent. It carries a number, never a secret.
const ChannelFDVar = "SHARDFS_SUPERVISOR_FD"

// DataFDVar tells a child which descriptor is the data stream of its
// channel (the copies of its logs' lines), apart from the control stream
// of ChannelFDVar.
const DataFDVar = "SHARDFS_SUPERVISOR_DATA_FD"

// Link is a child's end of its private channel.
type Link struct {
	f        *os.File
	w        *msgWriter
	dataF    *os.File      // nil: the data shares f
	data     *msgWriter    // the logs' lines
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
	f, err := channelFile(ChannelFDVar, text)
	if err != nil {
		return nil, err
	}
	var data *os.File
	if text, ok := os.LookupEnv(DataFDVar); ok {
		os.Unsetenv(DataFDVar)
		if data, err = channelFile(DataFDVar, text); err != nil {
			f.Close()
			return nil, err
		}
	}
	return newLink(f, data), nil
}

// channelFile opens an inherited descriptor of the channel: close on
// exec, so that nothing the child executes holds the channel open past
// the child's exit (the parent reads it to its end before it reaps), and
// non-blocking, so that os.NewFile puts it in the poller and Close ends
// a read in progress.
func channelFile(name, text string) (*os.File, error) {
	fd, err := strconv.Atoi(text)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", name, text)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("%s=%d: %w", name, fd, err)
	}
	return os.NewFile(uintptr(fd), "supervisor channel"), nil
}

// NewLink runs the child's side of the channel f, control and data on
// one stream, until Close.
func NewLink(f *os.File) *Link { return newLink(f, nil) }

func newLink(f, data *os.File) *Link {
	l := &Link{f: f, w: &msgWriter{w: f}, dataF: data, done: make(chan struct{}), waiting: map[uint64]waiter{}, floors: map[int]time.Time{}}
	l.data = l.w
	if data != nil {
		l.data = &msgWriter{w: data}
	}
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

// Watch reports, until ctx ends, how many of the node's shards are READY
// each time that changes, and each shard's state, sequence, reconnects
// and latency (the parent answers /status and /N/state from them), at
// each of the core's events and at least every second; the second's
// report is also the watchdog's sign of life (an alive message when
// nothing changed). Snapshot takes every shard's lock: a child whose
// shards are stuck stays silent, and the parent's watchdog kills it.
func (l *Link) Watch(ctx context.Context, n *core.Scheduler) {
	events := n.Events()
	diags := make([]core.Diag, 0, len(n.Plan().Local))
	sent := map[int]ShardState{}
	last := -1
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		diags = n.Snapshot(diags[:0])
		ready, told := 0, false
		for _, d := range diags {
			if d.State == core.Ready {
				ready++
			}
			st := diagState(d)
			if have, ok := sent[d.Shard]; ok && have == st {
				continue
			}
			if l.w.send(st.msg(d.Shard)) != nil {
				return
			}
			sent[d.Shard], told = st, true
		}
		l.sendLimit()
		if ready != last {
			if l.w.send(msg{T: "status", Ready: ready, Total: len(diags)}) != nil {
				return
			}
			last, told = ready, true
		}
		if !told && l.w.send(msg{T: "alive"}) != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-events.Notify():
		case <-tick.C:
		}
	}
}

// gapLine is the events line that says a copied log lost bytes.
func gapLine(now time.Time, log string, lost int64) []byte {
	if log == "" {
		log = "unnamed"
	}
	return eventLine(now, -1, "gap", "log", log, "lost_bytes", strconv.FormatInt(lost, 10))
}

// ShardState is what a child pushes of one shard: what the parent's
// /status, /N/state, /N/sequence and /N/reconnects show.
type ShardState struct {
	State      string
	Seq        int64
	NoSeq      bool // no sequence yet
	Reconnects uint64
	LatencyMs  int64
}

func diagState(d core.Diag) ShardState {
	return ShardState{State: d.State.String(), Seq: d.Sequence, NoSeq: !d.SequenceValid, Reconnects: d.Reconnects, LatencyMs: d.Latency.Milliseconds()}
}

func (st ShardState) msg(shard int) msg {
	m := msg{T: "shard", Shard: shard, State: st.State, NoSeq: st.NoSeq, Reconnects: st.Reconnects, LatencyMs: st.LatencyMs}
	if !st.NoSeq {
		m.Seq = st.Seq
	}
	return m
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
	if l.dataF != nil {
		l.dataF.Close()
	}
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
//
// Lines the log dropped before they were copied are said by a gap line
// (event=gap log=NAME lost_bytes=N) in their place, which the parent
// writes to its events and which stops it from resuming the child's
// shards after a crash (its /dispatch has a hole they would resume past).
func (l *Link) Copy(ctx context.Context, src Log) {
	l.CopyNamed(ctx, "", src)
}

// CopyNamed is Copy, with the log's name in its gap lines.
func (l *Link) CopyNamed(ctx context.Context, name string, src Log) {
	buf := make([]byte, 256<<10)
	var off int64
	for {
		ch := src.Notify()
		for {
			n, start := src.ReadAt(buf, off)
			if start > off {
				// The log dropped lines before they were copied (the
				// parent read slower than the child appended): the
				// parent must know, in order, that its copy has a hole.
				if l.data.raw(gapLine(time.Now(), name, start-off)) != nil {
					return
				}
				off = start
			}
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
			if l.data.raw(buf[:end]) != nil {
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

// TransitDispatch is what a supervised child keeps of its dispatch lines
// on their way to the parent, which alone keeps their history (DESIGN
// 7.4): the node's dispatch log is this transit buffer, and each shard's
// own log keeps its newest line (TransitShardDispatch). A line that the
// buffer drops before it was copied (the parent read slower than the
// child appended) is named, shard by shard, in a gap line.
const (
	TransitDispatch      = 1 << 20
	TransitShardDispatch = 1
)

// TransitEvents and TransitShardEvents are the same for a child's events
// logs: the node's, whose copy's gap lines name no shard (the core adds a
// few lines at a time, so 256 KiB seldom overflows), and each shard's,
// which the parent reads only for the reason of a refusal it forwarded
// (its newest lines: see forward).
const (
	TransitEvents      = 256 << 10
	TransitShardEvents = 4 << 10
)

// shardLoss counts what one shard lost in a copy.
type shardLoss struct{ lines, bytes int64 }

// CopyDispatch sends the node's dispatch lines (src, its merged log) to
// the parent as they are appended, from the start of the log, until ctx
// ends; then it sends what is left and returns. End ctx only after the
// node closed, so that the parent has every line the child wrote before
// its sessions were saved.
//
// Each line that src dropped before it was copied is counted for its
// shard, and before the next lines go out, one gap line per shard that
// lost some (shard=N event=gap log=dispatch lost_lines=K lost_bytes=B)
// tells the parent that its copy of that shard has a hole: that shard,
// and only that one, does not resume from the parent's points after a
// crash. A line longer than the channel takes is lost the same way.
func (l *Link) CopyDispatch(ctx context.Context, src *journal.Merged) {
	var (
		mu   sync.Mutex
		lost = map[int]*shardLoss{}
	)
	count := func(line []byte) {
		shard, _, ok := dispatchShardSeq(line)
		if !ok {
			shard = -1
		}
		mu.Lock()
		lo := lost[shard]
		if lo == nil {
			lo = &shardLoss{}
			lost[shard] = lo
		}
		lo.lines++
		lo.bytes += int64(len(line))
		mu.Unlock()
	}
	c := src.Follow(0, count)
	defer c.Close()
	if missed := c.Missed(); missed > 0 {
		// Dropped before the copy began: which shards, nobody knows.
		if l.data.raw(gapLine(time.Now(), "dispatch", missed)) != nil {
			return
		}
	}
	flush := func() error {
		mu.Lock()
		if len(lost) == 0 {
			mu.Unlock()
			return nil
		}
		was := lost
		lost = map[int]*shardLoss{}
		mu.Unlock()
		shards := slices.Sorted(maps.Keys(was))
		var b []byte
		for _, shard := range shards {
			b = append(b, shardGapLine(time.Now(), shard, was[shard])...)
		}
		return l.data.raw(b)
	}
	buf := make([]byte, 256<<10)
	for {
		ch := src.Notify()
		for {
			n, need := c.Next(buf)
			if flush() != nil {
				return
			}
			if need > maxMsg {
				// The parent would refuse it as garbage and stop the
				// child: it is lost, and said so.
				big := make([]byte, need)
				n, _ := c.Next(big) // retention may have taken it meanwhile
				var keep []byte
				for line := range bytes.Lines(big[:n]) {
					if len(line) > maxMsg {
						count(line)
					} else {
						keep = append(keep, line...)
					}
				}
				if flush() != nil || len(keep) > 0 && l.data.raw(keep) != nil {
					return
				}
				continue
			}
			if need > 0 {
				buf = make([]byte, need)
				continue
			}
			if n == 0 {
				break
			}
			if l.data.raw(buf[:n]) != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			if c.Offset() >= src.Size() {
				flush()
				return
			}
		case <-ch:
		}
	}
}

// shardGapLine is the events line that says a shard's copied dispatch
// lines were lost (shard -1: lines that named no shard).
func shardGapLine(now time.Time, shard int, lo *shardLoss) []byte {
	return eventLine(now, shard, "gap", "log", "dispatch", "lost_lines", strconv.FormatInt(lo.lines, 10), "lost_bytes", strconv.FormatInt(lo.bytes, 10))
}
