package core

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// Confirmed delivery (DESIGN 7.3, issue 22 item 1). A VM stopped by its
// hypervisor sees no time pass on any local clock, so the fence (Fence)
// cannot close while it is frozen: after the thaw it would deliver what
// it reads before any timer tells it the lease is gone. With a Confirmer
// the transport holds every received event until a confirmation that
// started after the event was read has shown that the node still holds
// its lease (like Raft's ReadIndex): a thawed node's first confirmation
// fails, and it delivers nothing it read.

// Confirmer confirms that this node still holds what it was granted.
// Confirm returns nil only after an exchange with the lease's authority
// that started after Confirm was called has shown the node's lease alive;
// ErrUnconfirmed (wrapped) when it showed the lease gone; any other error
// when it could not tell (etcd unreachable, ctx ended).
type Confirmer interface {
	Confirm(ctx context.Context) error
}

// ErrUnconfirmed is a confirmation that showed the node's lease gone:
// another node may own its shards now.
var ErrUnconfirmed = errors.New("ownership not confirmed: the lease is gone")

// ErrConfirmationsClosed is the answer to every wait once Close ran.
var ErrConfirmationsClosed = errors.New("confirmations closed")

// Confirmations is the Confirmer of a node: it shares one check (one
// etcd round trip) among every shard that waits, with at most one check
// in flight. A wait that arrives while a check runs joins the next one,
// which starts when the running one ends, so every check a wait is
// answered by started after the wait began, and the number of checks per
// second is bounded by the round trip, not by the event rate. After a
// failed check the next one starts no sooner than Retry later.
type Confirmations struct {
	check func(context.Context) error
	clock clock.Clock
	retry time.Duration
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu      sync.Mutex
	running bool   // a check is in flight, or the pause after a failure
	next    *round // the waits for the check after the running one
	closed  bool
	checks  uint64

	onWait func() // tests: called once a wait has joined its round
}

// round is one check and the waits it answers.
type round struct {
	done chan struct{}
	err  error
}

// ConfirmRetry is Confirmations' pause after a failed check when
// NewConfirmations is given none.
const ConfirmRetry = 100 * time.Millisecond

// NewConfirmations returns the Confirmer that runs check, one at a time,
// for every wait. check must bound itself (a timeout); c nil means real
// time; retry ≤ 0 means ConfirmRetry. Close ends it.
func NewConfirmations(check func(context.Context) error, c clock.Clock, retry time.Duration) *Confirmations {
	if retry <= 0 {
		retry = ConfirmRetry
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Confirmations{check: check, clock: clock.Or(c), retry: retry, ctx: ctx, stop: stop}
}

// Confirm waits for the first check that starts after the call.
func (c *Confirmations) Confirm(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrConfirmationsClosed
	}
	if c.next == nil {
		c.next = &round{done: make(chan struct{})}
	}
	r := c.next
	if !c.running {
		c.running = true
		c.next = nil
		c.checks++
		c.wg.Add(1)
		go c.run(r)
	}
	c.mu.Unlock()
	if c.onWait != nil {
		c.onWait()
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Checks is the number of checks started so far.
func (c *Confirmations) Checks() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checks
}

// run runs r's check, then the check of the waits that arrived meanwhile,
// until none is left.
func (c *Confirmations) run(r *round) {
	defer c.wg.Done()
	for {
		r.err = c.check(c.ctx)
		close(r.done)
		if r.err != nil {
			c.pause()
		}
		c.mu.Lock()
		r, c.next = c.next, nil
		if r == nil || c.closed {
			c.running = false
			c.mu.Unlock()
			if r != nil {
				r.err = ErrConfirmationsClosed
				close(r.done)
			}
			return
		}
		c.checks++
		c.mu.Unlock()
	}
}

// pause waits Retry after a failed check, so that an etcd that refuses at
// once is not asked in a loop; Close ends it early.
func (c *Confirmations) pause() {
	ch := make(chan struct{})
	t := c.clock.AfterFunc(c.retry, func() { close(ch) })
	select {
	case <-ch:
	case <-c.ctx.Done():
		t.Stop()
	}
}

// Close answers every wait with ErrConfirmationsClosed, ends the check in
// flight (its context is cancelled) and waits for it.
func (c *Confirmations) Close() {
	c.mu.Lock()
	c.closed = true
	r := c.next
	c.next = nil
	c.mu.Unlock()
	c.stop()
	if r != nil {
		r.err = ErrConfirmationsClosed
		close(r.done)
	}
	c.wg.Wait()
}

// Confirmed reports whether the event the transport has just read may be
// delivered. Without a Confirmer (Config.Confirm) it is true at once. With
// one it waits for a confirmation that starts after the call: true when it
// succeeds; false, after an events line fenced-read (what was dropped and
// why), when it showed the lease gone (the shard's lease then counts as
// expired and the shard stops, reason "lease lost"), or when it could not
// tell before the shard's fence closed or the connection was replaced.
// The transport then drops the event, delivers nothing more on the
// connection and ends it: a resume replays what was not delivered.
//
// The transport calls it on its reader, after reading and before
// delivering (dispatch, READY, RESUMED): the reader reads nothing more
// while it waits, so a shard holds at most one event unconfirmed.
func (l *Link) Confirmed() bool {
	c := l.s.node.confirm
	if c == nil {
		return true
	}
	return l.confirm(c)
}

func (l *Link) confirm(c Confirmer) bool {
	for {
		err := c.Confirm(context.Background())
		if err == nil {
			return true
		}
		if errors.Is(err, ErrUnconfirmed) {
			l.unconfirmed(err)
			return false
		}
		s := l.s
		s.mu.Lock()
		switch {
		case s.transport.link != l:
			// Replaced or stopped while it waited (the ownership layer
			// may have seen the loss first): not delivered either way.
			s.dropReadLocked("the connection ended while its read waited for a confirmation", err)
		case errors.Is(err, ErrConfirmationsClosed) || !s.fence.Open(s.node.clock):
			s.dropReadLocked("not confirmed before the fence closed", err)
		default:
			s.mu.Unlock()
			// Could not tell (etcd unreachable): hold the event and ask
			// again while the fence is open.
			continue
		}
		s.mu.Unlock()
		return false
	}
}

// unconfirmed drops the event read on l and expires the shard's lease
// now: etcd showed that this node's lease is gone. Only this shard acts
// here: every other shard's reader learns the same from its own next
// confirmation, and the ownership layer stops them all. The confirmation
// started after l's event was read, so after l's grant: the grant it
// refutes is this one or one already lost.
func (l *Link) unconfirmed(err error) {
	s := l.s
	s.mu.Lock()
	defer s.unlock()
	s.dropReadLocked("the lease is gone", err)
	if s.transport.link != l {
		return // replaced or stopped meanwhile: whoever did it decided
	}
	now := s.node.clock.Now()
	if s.fence != nil {
		s.fence.set(clock.Mono(s.node.clock), now)
	}
	if !s.lease.Deadline.IsZero() && now.Before(s.lease.Deadline) {
		s.lease.Deadline = now
	}
	s.leaseDueLocked(now)
}

// dropReadLocked writes the events line of an event read and dropped
// unconfirmed.
func (s *shard) dropReadLocked(why string, err error) {
	s.emit(s.line(s.node.clock.Now(), "fenced-read", slog.LevelWarn).int("dropped", 1).str("reason", why).err(err))
}
