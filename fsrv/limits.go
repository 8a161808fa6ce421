package fsrv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Bounds on what one client can hold (DESIGN.md section 5); diod has
// none, and one connection flooding Treads it never collected drove a
// server from 34 MB to 2.5 GB in seconds.
const (
	// MaxRequests is how many requests one connection may have in
	// flight. Past it the server stops reading that connection until
	// replies drain.
	MaxRequests = 64

	// MaxFids is how many fids one connection may hold. A request that
	// would make one more is refused (EMFILE, "too many open files: ...")
	// and the connection stays usable.
	MaxFids = 4096

	// DefaultMaxConns is the connection cap when Server.MaxConns is zero.
	DefaultMaxConns = 4096

	// DefaultMaxInFlightBytes is Server.MaxInFlightBytes when zero: with
	// the default msize (DefaultMaxMsize) 256 requests in flight over
	// every TCP and TLS connection, past the one each may always have.
	DefaultMaxInFlightBytes = 64 << 20

	// DefaultMessageTimeout bounds the time from the first byte of a
	// message to its last when Server.MessageTimeout is zero.
	DefaultMessageTimeout = 30 * time.Second
)

// Message types the tracker looks into, besides those version.go and
// dotl.go name. The .L ones do not exist in 9P2000 and the reverse.
const (
	msgRwalk        = 111
	msgTclunk       = 120
	msgTremove      = 122
	msgTxattrwalk   = 30
	msgTwalkgetattr = 126
	msgTwalk        = 110
)

var (
	// errTooManyFids refuses a request that would take a fid past MaxFids.
	errTooManyFids = errors.New("too many open files")
	// errDuplicateTag ends a connection that reuses the tag of a request
	// in flight: its replies could no longer be told apart, nor counted.
	errDuplicateTag = fmt.Errorf("%w: a tag reused while in flight", errFrame)
)

// request is what the tracker keeps of a request in flight.
type request struct {
	typ    uint8
	fid    uint32 // Tclunk, Tremove: the fid given up
	newfid uint32 // Tattach, Tauth, Twalk, ...: the fid made on success
	makes  bool   // newfid is made if the request succeeds
	nwname uint16 // Twalk: a walk that stops short makes no fid
	// flushes are the 9P2000.L Tflushes to answer right after this
	// request (dotlStream answers every Tflush itself).
	flushes []uint16
}

// fidPrefix is how much of a request's body parseRequest looks at.
const fidPrefix = 10

// parseRequest reads what the tracker needs from the start of a
// request's body (up to fidPrefix bytes).
func parseRequest(typ uint8, body []byte, dotl bool) request {
	r := request{typ: typ}
	u32 := func(i int) (uint32, bool) {
		if len(body) < i+4 {
			return 0, false
		}
		return binary.LittleEndian.Uint32(body[i:]), true
	}
	switch {
	case typ == msgTattach || typ == msgTauth:
		r.newfid, r.makes = u32(0)
	case typ == msgTwalk || dotl && (typ == msgTxattrwalk || typ == msgTwalkgetattr):
		r.newfid, r.makes = u32(4)
		if r.makes && typ != msgTxattrwalk {
			if len(body) < 10 {
				r.makes = false
			} else {
				r.nwname = binary.LittleEndian.Uint16(body[8:])
			}
		}
	case typ == msgTclunk || typ == msgTremove:
		r.fid, _ = u32(0)
	}
	return r
}

// tracker follows one connection's requests in flight and its fids,
// from the requests read and the replies written, so that it can bound
// both whichever engine serves the connection.
type tracker struct {
	mu      sync.Mutex
	cond    *sync.Cond
	reqs    map[uint16]request // by value: no allocation per request
	fids    map[uint32]struct{}
	making  int // requests in flight that may make a fid
	closed  bool
	maxReqs int
	maxFids int
	onStall func() // called when the reader starts waiting for room (tests)
	stalled bool
	// now stamps last, the start of the latest request, for the idle
	// timeout; nil leaves it zero.
	now  func() time.Time
	last time.Time

	// budget, if set, is the server's budget of bytes in flight, shared
	// by the connections of its TCP and TLS listeners (Server.
	// MaxInFlightBytes). A connection may always have one request in
	// flight; each one more takes cost() bytes (its msize, the largest
	// reply it can get) from budget until a reply gives them back.
	// charged are the amounts taken, at most one per request in flight
	// but the first; ctx ends a wait for the budget at close.
	budget  *semaphore.Weighted
	cost    func() int64
	charged []int64
	ctx     context.Context
	cancel  context.CancelFunc
	unwait  context.CancelFunc // ends the reader's wait for the budget
}

// touch marks the connection active now.
func (t *tracker) touch() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.now != nil {
		t.last = t.now()
	}
}

// activity reports whether a request is in flight, and when the latest
// started.
func (t *tracker) activity() (busy bool, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reqs) > 0, t.last
}

func newTracker() *tracker {
	t := &tracker{
		reqs:    make(map[uint16]request),
		fids:    make(map[uint32]struct{}),
		maxReqs: MaxRequests,
		maxFids: MaxFids,
	}
	t.cond = sync.NewCond(&t.mu)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// share makes the connection's requests past its first take cost()
// bytes each from budget (see tracker.budget).
func (t *tracker) share(budget *semaphore.Weighted, cost func() int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.budget, t.cost = budget, cost
}

// wait blocks while the connection has MaxRequests in flight, or while
// the server's budget has no room for one more of its requests. It
// returns false once the tracker is closed.
func (t *tracker) wait() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		for len(t.reqs) >= t.maxReqs && !t.closed {
			t.stall()
			t.cond.Wait()
		}
		if t.closed {
			return false
		}
		if t.budget == nil || len(t.charged) >= len(t.reqs) {
			t.give()
			t.stalled = false
			return true
		}
		n := t.cost()
		if !t.budget.TryAcquire(n) {
			t.stall()
			// The budget is other connections' too: wait for it without
			// the tracker's lock, which the replies to this one need. A
			// reply that leaves the connection nothing to charge (a
			// client that sends one request at a time) ends the wait.
			ctx, cancel := context.WithCancel(t.ctx)
			t.unwait = cancel
			t.mu.Unlock()
			err := t.budget.Acquire(ctx, n)
			t.mu.Lock()
			t.unwait = nil
			cancel()
			if t.closed {
				if err == nil {
					t.budget.Release(n)
				}
				return false
			}
			if err != nil {
				continue
			}
		}
		t.charged = append(t.charged, n)
	}
}

func (t *tracker) stall() {
	if !t.stalled {
		t.stalled = true
		if t.onStall != nil {
			t.onStall()
		}
	}
}

// give returns to the budget what the connection holds past what its
// requests in flight need; t.mu is held.
func (t *tracker) give() {
	for len(t.charged) > len(t.reqs) && !t.closed {
		n := t.charged[len(t.charged)-1]
		t.charged = t.charged[:len(t.charged)-1]
		t.budget.Release(n)
	}
	if t.unwait != nil && len(t.charged) >= len(t.reqs) {
		t.unwait()
	}
}

// start records a request read from the client, or refuses it: a tag in
// flight ends the connection, a fid past MaxFids is errTooManyFids.
func (t *tracker) start(tag uint16, r request) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.reqs[tag]; ok {
		return errDuplicateTag
	}
	if t.now != nil {
		t.last = t.now()
	}
	if r.makes {
		if _, ok := t.fids[r.newfid]; !ok && len(t.fids)+t.making >= t.maxFids {
			return fmt.Errorf("%w: the limit is %d fids per connection", errTooManyFids, t.maxFids)
		}
		t.making++
	}
	t.reqs[tag] = r
	return nil
}

// startFlush records a 9P2000.L Tflush of oldtag to be answered after
// oldtag's reply; it reports false when there is nothing to wait for
// and the Tflush is to be answered at once.
func (t *tracker) startFlush(tag, oldtag uint16) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.reqs[tag]; ok {
		return false, errDuplicateTag
	}
	old, ok := t.reqs[oldtag]
	if !ok || old.typ == msgTflush || oldtag == tag {
		return false, nil
	}
	old.flushes = append(old.flushes, tag)
	t.reqs[oldtag] = old
	t.reqs[tag] = request{typ: msgTflush}
	return true, nil
}

// pending reports whether a request with tag is in flight.
func (t *tracker) pending(tag uint16) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.reqs[tag]
	return ok && r.typ != msgTflush
}

// finish records the reply frame about to be written and returns the
// Tflushes that waited for it, which are answered too.
func (t *tracker) finish(frame []byte) []uint16 {
	if len(frame) < headerSize {
		return nil
	}
	typ, tag := frame[4], frameTag(frame)
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.reqs[tag]
	if !ok {
		return nil
	}
	delete(t.reqs, tag)
	if r.makes {
		t.making--
		ok := typ == r.typ+1
		if ok && typ == msgRwalk {
			ok = len(frame) >= headerSize+2 && binary.LittleEndian.Uint16(frame[headerSize:]) == r.nwname
		}
		if ok {
			t.fids[r.newfid] = struct{}{}
		}
	}
	if r.typ == msgTclunk || r.typ == msgTremove {
		// Both give up the fid whatever the reply says.
		delete(t.fids, r.fid)
	}
	for _, f := range r.flushes {
		delete(t.reqs, f)
	}
	t.give()
	t.cond.Broadcast()
	return r.flushes
}

// fidInUse reports whether fid is one the connection holds.
func (t *tracker) fidInUse(fid uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.fids[fid]
	return ok
}

// reset forgets every request in flight and every fid: a 9P2000
// Tversion inside a session aborts the one and clunks the other.
func (t *tracker) reset() {
	t.mu.Lock()
	clear(t.reqs)
	clear(t.fids)
	t.making = 0
	t.give()
	t.mu.Unlock()
	t.cond.Broadcast()
}

// close wakes a reader waiting for room: the connection is going away.
func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	// The connection goes away with its buffers: the budget is given
	// back now, not as the requests p9 still holds finish.
	for _, n := range t.charged {
		t.budget.Release(n)
	}
	t.charged = nil
	t.mu.Unlock()
	t.cancel()
	t.cond.Broadcast()
}

// inFlight is for tests.
func (t *tracker) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reqs)
}

// watchdog bounds the time a connection may take to send the rest of a
// message it started: with a read deadline where the connection has one,
// else by closing it. Only the connection's reader uses it.
type watchdog struct {
	d       deadliner
	timeout time.Duration
	close   func()
	timer   *time.Timer
	armed   bool
}

func (w *watchdog) arm() {
	if w == nil || w.armed {
		return
	}
	w.armed = true
	if w.d != nil {
		w.d.SetReadDeadline(time.Now().Add(w.timeout))
		return
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(w.timeout, w.close)
	} else {
		w.timer.Reset(w.timeout)
	}
}

func (w *watchdog) disarm() {
	if w == nil || !w.armed {
		return
	}
	w.armed = false
	if w.d != nil {
		w.d.SetReadDeadline(time.Time{})
		return
	}
	w.timer.Stop()
}

// replyWriter writes a connection's replies. A reply the client does not
// take within the timeout, or any failed write, ends the connection: a
// client that sends requests and never reads the replies would otherwise
// hold MaxRequests replies and their buffers for ever.
type replyWriter struct {
	w       io.Writer
	d       writeDeadliner // nil: writes are not bounded
	timeout time.Duration
	fail    func()
}

type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

func (r *replyWriter) Write(b []byte) (int, error) {
	if r.d != nil {
		r.d.SetWriteDeadline(time.Now().Add(r.timeout))
	}
	n, err := r.w.Write(b)
	if err != nil {
		r.fail()
	}
	return n, err
}
