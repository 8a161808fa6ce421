package core

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/journal"
)

var errOperatorReset = errors.New("operator reset")

// shard is one shard's context. Every input locks mu, so inputs for one
// shard never touch another's. Its fields are grouped by what a reset
// does to them (DESIGN.md section 2): the transport state it wipes in one
// assignment, the session it keeps (apart from the resume rule), and the
// rest, which lives as long as the shard.
type shard struct {
	node   *Scheduler
	id     int
	events *journal.Log

	mu         sync.Mutex
	state      State     // changed only by moveLocked
	since      time.Time // when state last changed
	stopReason StopReason

	transport transportState
	// closed is the latest connection closed, which a reset keeps:
	// Handover waits for it to end.
	closed Conn
	sess   sessionState
	store  storeState

	reconnects    uint64
	hbMissesTotal uint64
	failures      int // consecutive, for the backoff policy
	readySince    time.Time
	attempt       int  // attempts to get a session, one running count
	recovery      bool // a READY session has ended: every attempt now recovers
	identifies    uint64
	resumes       uint64
	dispatches    uint64
	lease         LeaseGrant
	leaseExpire   bool
	// fence is handed to every connection the shard opens under the
	// current grant; nil while no lease was ever granted.
	fence *Fence

	timer      clock.Timer // reconnect deadline
	sendTimer  clock.Timer
	leaseTimer clock.Timer
	slotCancel func() // pending identify slot request
	slotSeq    uint64 // never goes back: a grant for an older request is stale
	// operatorNext makes the next slot request an operator's (identify,
	// retry), which may spend the budget's reserve; slotOperator is the
	// kind of the pending one.
	operatorNext, slotOperator bool

	// storeMu orders each shard's session store calls (see restore.go)
	// with the stops and starts they belong to; it is taken before mu,
	// never inside it.
	storeMu sync.Mutex
}

// transportState is the shard's private transport state: what a reset
// wipes (DESIGN.md section 2, "Reset scope": the connection, the send
// queue, heartbeat and error state, the reconnect deadline; the
// compression context lives in the connection). A field added here is
// wiped by every reset; resetAndStartLocked does it in one assignment.
type transportState struct {
	conn      Conn
	link      *Link // events from any other link are stale
	connState ConnState
	phase     Phase
	lastErr   error
	lastCode  int
	deadline  time.Time     // reconnect deadline in BACKOFF
	delay     time.Duration // the wait scheduled on entering BACKOFF
	latency   time.Duration
	hbMisses  uint64 // unacknowledged heartbeats on this connection
	sendQ     [][]byte
	socketID  bool // the next identify slot is used on the open socket
	resuming  bool // the current connection was opened to resume
}

// sessionState is the gateway session, which a reset keeps: of it, the
// reset touches only the sequence, by the resume rule.
type sessionState struct {
	session  Session
	valid    bool // the session may be resumed
	seq      int64
	seqValid bool
	epoch    uint64
	// failedResumes counts resumes in a row that failed after their
	// Resume went out.
	failedResumes int
	sends         sendHistory
}

// storeState is what the shard knows of its snapshot in the session
// store (see restore.go).
type storeState struct {
	loadDone    bool          // the snapshot was loaded, or will never be
	stored      bool          // the store holds the session, resumable
	storedAt    time.Time     // its saved_at
	restored    bool          // the session came from a snapshot
	restoredAge time.Duration // the snapshot's age when loaded
}

// Link carries one connection attempt's events to its shard. Events from a
// link that is no longer the shard's current one are dropped, so a late
// event from an old connection cannot disturb the new one.
type Link struct {
	s *shard
}

// Shard returns the shard ID the link belongs to.
func (l *Link) Shard() int { return l.s.id }

// lockCurrent locks the shard and reports whether l is still its link; it
// unlocks and returns false otherwise.
func (l *Link) lockCurrent() bool {
	l.s.mu.Lock()
	if l.s.transport.link != l {
		l.s.mu.Unlock()
		return false
	}
	return true
}

// lockReceiving is lockCurrent for what the connection received: it also
// returns false, unlocked, once the shard's fence is closed (Fence.Open),
// so that nothing read after the deadline is counted, delivered or written
// to the events.
func (l *Link) lockReceiving() bool {
	if !l.lockCurrent() {
		return false
	}
	if !l.s.fence.Open(l.s.node.clock) {
		l.s.mu.Unlock()
		return false
	}
	return true
}

// Phase records the connection phase the transport reached.
func (l *Link) Phase(p Phase) {
	if l.lockCurrent() {
		l.s.transport.phase = p
		l.s.mu.Unlock()
	}
}

// Transport records the state of the connection's layers.
func (l *Link) Transport(cs ConnState) {
	if l.lockCurrent() {
		l.s.transport.connState = cs
		l.s.mu.Unlock()
	}
}

// Heartbeat records a heartbeat round trip.
func (l *Link) Heartbeat(latency time.Duration) {
	if l.lockCurrent() {
		l.s.transport.latency = latency
		l.s.mu.Unlock()
	}
}

// HeartbeatMissed records a heartbeat that the gateway did not acknowledge
// in time. It only counts, for diagnostics: the transport decides, and
// reports with Fail, when missed acknowledgements make a connection a
// zombie.
func (l *Link) HeartbeatMissed() {
	if l.lockCurrent() {
		l.s.transport.hbMisses++
		l.s.hbMissesTotal++
		l.s.mu.Unlock()
	}
}

// Dispatch records the sequence of a dispatch the shard received. Only a
// live session or the replay of a resume has a sequence: a dispatch on a
// connection that is identifying belongs to no session and is not counted.
func (l *Link) Dispatch(seq int64) { l.DispatchDo(seq, nil) }

// DispatchDo is Dispatch that also runs deliver, which writes the
// dispatch where its readers see it, under the shard's lock, and only
// while l is the shard's link. So a dispatch is either delivered and
// counted in the sequence, or neither: a stop (or a handover) that takes
// the sequence for a snapshot cannot fall between the two, and a resume
// from that snapshot replays exactly what was not delivered. deliver
// must be quick and must not call the Scheduler.
//
// Past the shard's fence (Fence.Open) the dispatch is neither counted nor
// delivered: the lease may be gone and another node may be delivering the
// same event, so a node woken from a pause delivers nothing it read after
// its deadline, whichever of its overdue timers or readers runs first.
func (l *Link) DispatchDo(seq int64, deliver func()) {
	if l.lockReceiving() {
		if s := l.s; s.state == Ready || s.state == Starting && s.transport.resuming {
			s.sess.seq, s.sess.seqValid = seq, true
			s.dispatches++
		}
		if deliver != nil {
			deliver()
		}
		l.s.mu.Unlock()
	}
}

// Ready records a new session (READY at sequence seq).
func (l *Link) Ready(sess Session, seq int64) {
	defer l.s.node.observe(EventReady).done()
	if !l.lockReceiving() {
		return
	}
	s := l.s
	defer s.unlock()
	now := s.node.clock.Now()
	s.moveLocked(Ready, now)
	s.transport.phase, s.readySince = PhaseReady, now
	s.sess.session, s.sess.valid = sess, true
	s.sess.seq, s.sess.seqValid = seq, true
	s.sess.failedResumes = 0
	s.dispatches++
	s.store.restored, s.store.restoredAge = false, 0
	s.sess.epoch = s.node.nextEpoch(s.sess.epoch, now)
	s.newSessionSendsLocked()
	s.emit(s.line(now, "ready", slog.LevelInfo).int("epoch", int64(s.sess.epoch)).int("sequence", seq).int("attempt", int64(s.attempt)))
}

// Resumed records a successful resume (RESUMED at sequence seq). On a
// connection that did not resume it means nothing and is dropped.
func (l *Link) Resumed(seq int64) {
	defer l.s.node.observe(EventResumed).done()
	if !l.lockReceiving() {
		return
	}
	s := l.s
	defer s.unlock()
	if !s.transport.resuming {
		return
	}
	now := s.node.clock.Now()
	s.moveLocked(Ready, now)
	s.transport.phase, s.readySince = PhaseReady, now
	s.sess.failedResumes = 0
	if seq > 0 {
		s.sess.seq, s.sess.seqValid = seq, true
	}
	s.emit(s.line(now, "resumed", slog.LevelInfo).int("epoch", int64(s.sess.epoch)).int("sequence", s.sess.seq).int("attempt", int64(s.attempt)))
}

// Fail reports a classified failure of the connection.
func (l *Link) Fail(f Failure) {
	defer l.s.node.observe(EventFail).done()
	if !l.lockCurrent() {
		return
	}
	func() {
		defer l.s.unlock()
		l.s.failLocked(f)
	}()
	if f.Class == FatalFailure && f.Token {
		l.s.node.sweepToken()
	}
}

// Invalidated reports that the gateway invalidated the session but kept
// the socket open (Fluxer's op 9): the shard identifies on the same socket
// once the pacer grants a slot.
func (l *Link) Invalidated() {
	defer l.s.node.observe(EventInvalidated).done()
	if !l.lockCurrent() {
		return
	}
	s := l.s
	defer s.unlock()
	now := s.node.clock.Now()
	s.sess.valid, s.sess.seqValid, s.sess.seq = false, false, 0
	s.moveLocked(Starting, now)
	s.transport.resuming = false
	s.attempt++
	s.emit(s.line(now, "invalidated", slog.LevelWarn).str("state", s.state.String()))
	s.dropSendsLocked("session invalidated")
	s.transport.socketID = true
	s.requestSlotLocked()
}

// Recover, deferred at the top of a transport goroutine, turns a panic into
// a transient failure of that shard alone, with the stack in its events.
func (l *Link) Recover() {
	if r := recover(); r != nil {
		l.s.logPanic(r, debug.Stack())
		l.Fail(Failure{Class: Transient, Err: fmt.Errorf("panic: %v", r)})
	}
}

// logPanic writes a recovered panic and its stack to the shard's events.
func (s *shard) logPanic(r any, stack []byte) {
	s.emit(s.line(s.node.clock.Now(), "panic", slog.LevelError).str("panic", fmt.Sprint(r)).str("stack", string(stack)))
}

// unlock, deferred right after s.mu.Lock() in every entry into the shard,
// releases the lock; a panic on the way is recovered first and leaves the
// shard in a state it recovers from.
func (s *shard) unlock() {
	if r := recover(); r != nil {
		s.recoverLocked(r, debug.Stack())
	}
	s.mu.Unlock()
}

// recoverLocked handles a panic that reached the end of an entry into the
// shard like a transport failure of the shard, whether or not it has a
// connection at the moment.
func (s *shard) recoverLocked(r any, stack []byte) {
	err := fmt.Errorf("panic: %v", r)
	defer func() {
		if recover() != nil {
			s.lastResortLocked(err)
		}
	}()
	s.logPanic(r, stack)
	s.panicFailLocked(err)
}

// callout runs f, code the core does not own (the transport, the pacer, a
// connection), and returns the panic it raised as an error, its stack
// logged to the shard's events.
func (s *shard) callout(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logPanic(r, debug.Stack())
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	f()
	return nil
}

// panicFailLocked handles a recovered panic like a transient failure, with
// one difference: the shard never reconnects from within it, even when the
// policy's delay is zero, so that a transport that panics on every Connect
// meets a timer rather than a recursion.
func (s *shard) panicFailLocked(err error) {
	now := s.node.clock.Now()
	switch {
	case s.state == Fatal || s.state == Stopped:
		s.closeConnLocked(4000)
		s.cancelPendingLocked()
		return
	case s.node.closed.Load():
		s.stopLocked(now, StoppedByShutdown, 4000)
		return
	}
	s.transport.lastErr, s.transport.lastCode = err, 0
	s.enterBackoffLocked(now, time.Time{}, 4000, false)
}

// lastResortDelay is the wait after a panic that even the failure handling
// of a panic could not get past (a logger or a backoff policy that panics).
const lastResortDelay = 5 * time.Second

// lastResortLocked puts the shard in BACKOFF, or STOPPED after Close,
// calling nothing the core does not own. Both moves are listed from
// every state it may find (TestLifecycleTable), so moveLocked cannot
// panic here.
func (s *shard) lastResortLocked(err error) {
	s.transport.link, s.transport.conn, s.slotCancel = nil, nil, nil
	s.slotSeq++
	if s.state == Fatal || s.state == Stopped {
		return
	}
	now := s.node.clock.Now()
	s.transport.lastErr = err
	if s.node.closed.Load() {
		s.moveLocked(Stopped, now)
		s.stopReason, s.transport.phase = StoppedByShutdown, PhaseStopped
		return
	}
	s.moveLocked(Backoff, now)
	s.transport.phase = PhaseBackoff
	s.reconnects++
	s.transport.deadline, s.transport.delay = now.Add(lastResortDelay), lastResortDelay
	if s.timer == nil {
		s.timer = s.node.clock.AfterFunc(lastResortDelay, s.backoffDue)
	} else {
		s.timer.Reset(lastResortDelay)
	}
}

func (s *shard) line(now time.Time, event string, level slog.Level) *eventLine {
	return newEventLine(now, s.id, event, level, s.node.log)
}

// emit appends an event line to the shard's log and the node's.
func (s *shard) emit(e *eventLine) {
	b := e.finish(s.node.log)
	now := s.node.clock.Now()
	s.events.Append(b, now)
	s.node.events.Append(b, now)
	e.release()
}

func (s *shard) resumable() bool { return s.sess.session.exists() && s.sess.valid && s.sess.seqValid }

// leaseBlocks reports whether the lease forbids traffic now.
// The fence, when there is one, decides on the monotonic clock, so that a
// step of the wall clock cannot revive a lease that ran out.
func (s *shard) leaseBlocks(now time.Time) bool {
	if s.lease.Deadline.IsZero() {
		return false
	}
	if s.leaseExpire {
		return true
	}
	if s.fence != nil {
		return !s.fence.Allows(clock.Mono(s.node.clock))
	}
	return !now.Before(s.lease.Deadline)
}

// startLocked moves the shard to STARTING: it resumes at once when it can,
// and otherwise asks the pacer for an identify slot. An invalid lease or a
// closed node stops it instead.
func (s *shard) startLocked(now time.Time) {
	if s.node.closed.Load() {
		// Close has run, or runs after this and stops the shard again:
		// nothing connects after Close, whatever asked (a late lease
		// grant, a command or timer in flight).
		if s.state != Stopped {
			s.stopLocked(now, StoppedByShutdown, 4000)
		}
		return
	}
	if s.leaseBlocks(now) {
		s.stopLocked(now, s.leaseStopReason(), 4000)
		return
	}
	s.moveLocked(Starting, now)
	s.stopReason = NotStopped
	s.attempt++
	if s.tokenRefusedLocked() {
		return // a resume with the refused token would fail as an identify does
	}
	if s.resumable() {
		s.connectLocked(true)
		return
	}
	s.requestSlotLocked()
}

func (s *shard) requestSlotLocked() {
	if s.tokenRefusedLocked() {
		return
	}
	if cancel := s.slotCancel; cancel != nil {
		s.slotCancel = nil
		s.callout(cancel)
	}
	s.transport.phase = PhaseWaitSlot
	s.slotSeq++
	seq := s.slotSeq
	op := s.operatorNext
	s.operatorNext, s.slotOperator = false, op
	var granted bool
	var cancel func()
	if err := s.callout(func() { granted, cancel = s.node.pacer.Request(s.id, op, func() { s.slotGranted(seq) }) }); err != nil {
		s.panicFailLocked(err)
		return
	}
	if granted {
		s.identifyNowLocked()
		return
	}
	s.slotCancel = cancel
}

func (s *shard) slotGranted(seq uint64) {
	defer s.node.observe(EventIdentifySlot).done()
	s.mu.Lock()
	defer s.unlock()
	if seq != s.slotSeq || s.slotCancel == nil || s.state != Starting {
		return
	}
	s.slotCancel = nil
	s.identifyNowLocked()
}

func (s *shard) identifyNowLocked() {
	if s.transport.socketID && s.transport.conn != nil {
		s.transport.socketID = false
		s.transport.phase = PhaseIdentify
		c := s.transport.conn
		if err := s.callout(c.Identify); err != nil {
			s.panicFailLocked(err)
			return
		}
		s.identifies++
		return
	}
	s.transport.socketID = false
	s.connectLocked(false)
}

// slotDeadline is what the pacer says of the slot it just granted shard s
// (SlotDeadliner), for the attempt that identifies on it.
func (s *shard) slotDeadline() (by time.Duration, unused func()) {
	d, ok := s.node.pacer.(SlotDeadliner)
	if !ok {
		return 0, nil
	}
	var has bool
	if err := s.callout(func() { by, unused, has = d.IdentifyBy(s.id) }); err != nil || !has {
		return 0, nil
	}
	return by, unused
}

// connectLocked binds a new connection to the shard. The connection
// becomes the shard's only once Connect has returned it: a Connect that
// panics leaves no half-bound link behind.
func (s *shard) connectLocked(resume bool) {
	l := &Link{s: s}
	s.transport.phase = PhaseDial
	s.transport.connState = ConnState{}
	a := Attempt{
		Shard: s.id, Total: s.node.plan.Total,
		Resume: resume, Session: s.sess.session, Sequence: s.sess.seq,
		LeaseGeneration: s.lease.Generation,
		Fence:           s.fence,
	}
	if !resume {
		a.IdentifyBy, a.SlotUnused = s.slotDeadline()
	}
	s.transport.hbMisses = 0
	var c Conn
	if err := s.callout(func() { c = s.node.transport.Connect(l, a) }); err != nil {
		s.panicFailLocked(err)
		return
	}
	s.transport.conn, s.transport.link, s.transport.resuming = c, l, resume
	if resume {
		s.resumes++
	} else {
		s.identifies++
	}
}

// closeConnLocked closes the current connection, if any, and makes its
// link stale.
func (s *shard) closeConnLocked(code int) {
	s.transport.link = nil
	if c := s.transport.conn; c != nil {
		s.transport.conn, s.closed = nil, c
		// A Close that panics still leaves the connection dropped.
		s.callout(func() { c.Close(code) })
	}
}

// cancelPendingLocked drops what the shard waits for: the reconnect
// deadline, an identify slot, queued commands.
func (s *shard) cancelPendingLocked() {
	if s.timer != nil {
		s.timer.Stop()
	}
	if cancel := s.slotCancel; cancel != nil {
		s.slotCancel = nil
		s.callout(cancel)
	}
	s.slotSeq++
	s.dropPendingSendsLocked()
	s.transport.socketID = false
}

func (s *shard) failLocked(f Failure) {
	now := s.node.clock.Now()
	s.transport.lastErr, s.transport.lastCode = f.Err, f.Code
	if f.Class == Transient && s.state == Starting && s.transport.resuming && s.transport.phase == PhaseResume {
		s.sess.failedResumes++
		if s.sess.failedResumes >= MaxFailedResumes {
			s.sess.failedResumes = 0
			s.sess.valid = false
			s.emit(s.line(now, "new-session", slog.LevelWarn).str("reason", fmt.Sprintf("%d resumes in a row failed", MaxFailedResumes)).err(f.Err))
		}
	}
	switch f.Class {
	case FatalFailure:
		// The gateway ended the session with the close: retry must
		// identify, not resume a session that no longer exists.
		s.sess.valid = false
		s.dropSendsLocked("fatal failure")
		s.closeConnLocked(4000)
		s.cancelPendingLocked()
		s.moveLocked(Fatal, now)
		s.transport.phase = PhaseStopped
		if f.Token {
			s.noteTokenLocked(f)
		}
		if f.swept {
			// The node's one token-refused line says it for every shard.
			e := newEventLine(now, s.id, "fatal", slog.LevelError, nil).str("state", s.state.String()).err(f.Err).int("code", int64(f.Code))
			s.events.Append(e.finish(nil), now)
			e.release()
		} else {
			s.emit(s.line(now, "fatal", slog.LevelError).str("state", s.state.String()).err(f.Err).int("code", int64(f.Code)).conn(s.transport.connState))
		}
		if h := s.node.onFatal; h != nil {
			h(s.id, f.Code)
		}
	case NewSession:
		s.sess.valid = false
		s.enterBackoffLocked(now, f.Deadline, 1000, true)
	default:
		deadline := f.Deadline
		if !deadline.IsZero() && !deadline.After(now) && !(s.state == Ready && now.Sub(s.readySince) >= ImmediateAfter) {
			// A gateway asking to reconnect at once (op 7) again and
			// again, before the shard has settled, gets the policy's
			// delay: a storm of requests must not become a busy loop.
			deadline = time.Time{}
		}
		s.enterBackoffLocked(now, deadline, 4000, true)
	}
}

// ImmediateAfter is how long a shard must have been READY for a request to
// reconnect at once (op 7) to be honoured at once; sooner, the backoff
// policy decides, as for any transient failure.
const ImmediateAfter = 5 * time.Second

// enterBackoffLocked follows the order of DESIGN.md: state, reconnects,
// deadline, then the log of the error and transport states, before any
// reset can wipe them. A deadline already due reconnects at once, unless
// restart is false.
func (s *shard) enterBackoffLocked(now, deadline time.Time, closeCode int, restart bool) {
	s.moveLocked(Backoff, now)
	s.reconnects++
	if deadline.IsZero() {
		s.failures++
		deadline = now.Add(s.node.backoff.Delay(s.failures, s.resumable(), s.node.rand()))
	}
	s.transport.deadline, s.transport.delay = deadline, max(deadline.Sub(now), 0)
	s.emit(s.line(now, "backoff", slog.LevelWarn).str("state", s.state.String()).int("reconnects", int64(s.reconnects)).
		err(s.transport.lastErr).int("code", int64(s.transport.lastCode)).conn(s.transport.connState).int("retry_ms", deadline.Sub(now).Milliseconds()))
	s.closeConnLocked(closeCode)
	s.cancelPendingLocked()
	s.transport.phase = PhaseBackoff
	if restart && !deadline.After(now) {
		s.resetAndStartLocked(now)
		return
	}
	if s.timer == nil {
		s.timer = s.node.clock.AfterFunc(max(deadline.Sub(now), 0), s.backoffDue)
	} else {
		s.timer.Reset(max(deadline.Sub(now), 0))
	}
}

func (s *shard) backoffDue() {
	defer s.node.observe(EventBackoffTimer).done()
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	if s.state != Backoff || now.Before(s.transport.deadline) {
		return // stale: the shard moved on or the deadline moved
	}
	s.resetAndStartLocked(now)
}

// resetAndStartLocked resets the shard's transport state, applies the
// resume rule, binds a new connection and then logs the retry.
func (s *shard) resetAndStartLocked(now time.Time) {
	// Closing the connection and dropping what waits for it log what
	// they drop, so they come before the wipe.
	s.closeConnLocked(4000)
	s.cancelPendingLocked()
	s.transport = transportState{}
	// The resume rule: the sequence survives the reset only for a session
	// that exists and is valid, and only if it was valid itself;
	// otherwise it is none, and the next start identifies afresh.
	if !s.resumable() {
		s.sess.seq, s.sess.seqValid = 0, false
	}

	s.startLocked(now)
	if s.state != Starting {
		return
	}
	mode := "identify"
	if s.resumable() {
		mode = "resume"
	}
	e := s.line(now, "retry", slog.LevelInfo).str("state", s.state.String()).str("mode", mode).int("attempt", int64(s.attempt))
	if s.sess.seqValid {
		e.int("sequence", s.sess.seq)
	} else {
		e.str("sequence", "none")
	}
	s.emit(e)
}

func (s *shard) stopLocked(now time.Time, why StopReason, code int) {
	s.dropSendsLocked(stopDropReason(why))
	s.closeConnLocked(code)
	s.cancelPendingLocked()
	s.moveLocked(Stopped, now)
	s.stopReason, s.transport.phase = why, PhaseStopped
	s.emit(s.line(now, "stopped", slog.LevelInfo).str("state", s.state.String()).str("reason", why.String()))
}

func (s *shard) startAssigned() {
	s.mu.Lock()
	defer s.unlock()
	if s.state != Assigned {
		return
	}
	now := s.node.clock.Now()
	s.emit(s.line(now, "start", slog.LevelInfo))
	s.startLocked(now)
}

func (s *shard) shutdown() {
	s.mu.Lock()
	defer s.unlock()
	if s.leaseTimer != nil {
		s.leaseTimer.Stop()
	}
	if s.state == Fatal || s.state == Stopped {
		s.cancelPendingLocked()
		return
	}
	s.stopLocked(s.node.clock.Now(), StoppedByShutdown, 4000)
}

// errNoop marks a command that is already satisfied.
var errNoop = errors.New("nothing to do")

// check says whether verb applies to the shard now: nil, errNoop, or an
// ErrBusy error naming the shard and its state.
func (s *shard) check(v Verb) error {
	s.mu.Lock()
	defer s.unlock()
	return s.checkLocked(v, s.node.clock.Now())
}

func (s *shard) checkLocked(v Verb, now time.Time) error {
	busy := func(hint string) error {
		return fmt.Errorf("%w: shard %d is %s; %s", ErrBusy, s.id, s.state, hint)
	}
	switch v {
	case VerbReset, VerbIdentify:
		if s.state == Starting || s.state == Ready || s.state == Backoff {
			return nil
		}
		if s.state == Fatal {
			return busy("write retry to start it")
		}
		return busy("write start to start it")
	case VerbStop:
		if s.state == Fatal {
			return busy("write retry to start it")
		}
		if s.state == Stopped && !s.stopReason.byLease() {
			return errNoop
		}
		return nil
	case VerbStart:
		switch s.state {
		case Fatal:
			return busy("write retry to start it")
		case Assigned, Stopped:
			if s.leaseBlocks(now) {
				return busy("its lease has expired; arm it first")
			}
			return nil
		}
		return errNoop
	case VerbRetry:
		if s.state == Fatal {
			return nil
		}
		return busy("retry applies to FATAL shards")
	}
	return fmt.Errorf("%w: %s is not a shard command", ErrUsage, v)
}

// apply carries out verb if it applies to the shard's state now.
func (s *shard) apply(v Verb) {
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	if s.checkLocked(v, now) != nil {
		return
	}
	switch v {
	case VerbReset:
		// From BACKOFF too: the operator's reset is one more failure,
		// logged and counted like any other, that cuts the wait short.
		s.transport.lastErr, s.transport.lastCode = errOperatorReset, 4000
		s.enterBackoffLocked(now, now, 4000, true)
	case VerbStop:
		if s.state == Stopped { // stopped by lease: the operator takes over
			s.stopReason = StoppedByOperator
			s.emit(s.line(now, "stopped", slog.LevelInfo).str("state", s.state.String()).str("reason", s.stopReason.String()))
			return
		}
		s.stopLocked(now, StoppedByOperator, 4000)
	case VerbStart, VerbRetry:
		s.node.clearToken()
		s.emit(s.line(now, v.String(), slog.LevelInfo).str("state", s.state.String()))
		s.failures = 0
		s.operatorNext = v == VerbRetry
		s.resetAndStartLocked(now)
		s.operatorNext = false
	case VerbIdentify:
		s.node.clearToken()
		s.emit(s.line(now, "identify", slog.LevelInfo).str("state", s.state.String()))
		s.closeConnLocked(1000)
		s.sess.valid = false
		s.failures = 0
		s.operatorNext = true
		s.resetAndStartLocked(now)
		s.operatorNext = false
	}
}

// leaseStopReason is why the lease keeps the shard stopped.
func (s *shard) leaseStopReason() StopReason {
	switch {
	case !s.lease.Owner:
		return StoppedByLease
	case s.lease.Generation == 0:
		return StoppedNotOwned
	}
	return StoppedByLeaseLost
}

// monoDeadline is the monotonic reading at which a grant's deadline falls,
// computed once from now: a later step of the wall clock does not move it.
func (s *shard) monoDeadline(g LeaseGrant, now time.Time) time.Duration {
	if g.Deadline.IsZero() {
		return math.MaxInt64
	}
	return clock.Mono(s.node.clock) + g.Deadline.Sub(now)
}

func (s *shard) setLease(g LeaseGrant) {
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	sameGen := g.Generation == s.lease.Generation && g.Owner == s.lease.Owner
	renewal := sameGen && !g.Deadline.IsZero() && !s.lease.Deadline.IsZero()
	// A moved shard comes back only with a new generation: a renewal of
	// the old one racing the handover must not restart it.
	moved := s.state == Stopped && s.stopReason == StoppedByMove && sameGen
	s.lease = g
	if !sameGen && g.Owner && g.Generation != 0 && s.state == Stopped && s.stopReason == StoppedByMove {
		// The move was of the old generation. A grant of a new one that
		// arrives expired (its snapshot load outlasted the deadline) leaves
		// the shard stopped by the lease, so that the renewals of that
		// generation start it; kept "moved", the shard ran nowhere while
		// its key was held.
		s.stopReason = s.leaseStopReason()
	}
	if sameGen && s.fence != nil && !moved {
		s.fence.set(s.monoDeadline(g, now), g.Deadline)
	} else if !moved {
		s.fence = newFence(s.monoDeadline(g, now), g.Deadline)
	}
	if !g.Deadline.IsZero() && !now.Before(g.Deadline) {
		s.leaseDueLocked(now)
		return
	}
	if moved {
		return
	}
	s.leaseExpire = false
	if g.Deadline.IsZero() || s.node.closed.Load() {
		// After Close the grant is recorded, but nothing is left running.
		if s.leaseTimer != nil {
			s.leaseTimer.Stop()
		}
	} else if s.leaseTimer == nil {
		s.leaseTimer = s.node.clock.AfterFunc(g.Deadline.Sub(now), s.leaseDue)
	} else {
		s.leaseTimer.Reset(g.Deadline.Sub(now))
	}
	if !renewal {
		e := s.line(now, "lease", slog.LevelInfo).int("generation", int64(g.Generation))
		if g.Deadline.IsZero() {
			e.str("deadline", "off")
		} else {
			e.str("deadline", g.Deadline.UTC().Format(time.RFC3339Nano))
		}
		s.emit(e)
	}
	if s.state == Stopped && s.stopReason.byLease() {
		s.resetAndStartLocked(now)
	}
}

func (s *shard) leaseDue() {
	defer s.node.observe(EventLeaseTimer).done()
	s.mu.Lock()
	defer s.unlock()
	s.leaseDueLocked(s.node.clock.Now())
}

// leaseDueLocked is the lease tick: already expired, nothing; deadline
// zero, enforcement is off; now at or past the deadline, expire and stop
// the shard's traffic.
func (s *shard) leaseDueLocked(now time.Time) {
	switch {
	case s.leaseExpire, s.lease.Deadline.IsZero(), now.Before(s.lease.Deadline):
		return
	}
	s.leaseExpire = true
	why := s.leaseStopReason()
	if why != StoppedNotOwned {
		s.emit(s.line(now, "lease-expired", slog.LevelWarn).int("generation", int64(s.lease.Generation)).str("reason", why.String()))
	}
	switch s.state {
	case Starting, Ready, Backoff:
		s.stopLocked(now, why, 4000)
	case Stopped:
		if s.stopReason.byLease() && s.stopReason != StoppedByMove {
			s.stopReason = why
		}
	}
}

func (s *shard) sendCommand(p []byte) error {
	s.mu.Lock()
	defer s.unlock()
	if s.state != Ready || s.transport.conn == nil {
		return fmt.Errorf("%w: shard %d is %s; commands go only to READY shards", ErrBusy, s.id, s.state)
	}
	now := s.node.clock.Now()
	pol := s.node.send
	if len(s.transport.sendQ) == 0 && !s.sess.sends.allowAt(now, pol).After(now) {
		s.sess.sends.record(now, pol)
		return s.transport.conn.Send(p)
	}
	if len(s.transport.sendQ) >= pol.Queue {
		return fmt.Errorf("%w: shard %d has %d commands waiting for the send budget", ErrBusy, s.id, len(s.transport.sendQ))
	}
	s.transport.sendQ = append(s.transport.sendQ, append([]byte(nil), p...))
	s.armSendLocked(now)
	return nil
}

func (s *shard) armSendLocked(now time.Time) {
	d := s.sess.sends.allowAt(now, s.node.send).Sub(now)
	if s.sendTimer == nil {
		s.sendTimer = s.node.clock.AfterFunc(d, s.sendDue)
	} else {
		s.sendTimer.Reset(d)
	}
}

func (s *shard) sendDue() {
	defer s.node.observe(EventSendTimer).done()
	s.mu.Lock()
	defer s.unlock()
	if s.state != Ready || s.transport.conn == nil {
		return
	}
	now := s.node.clock.Now()
	pol := s.node.send
	for len(s.transport.sendQ) > 0 && !s.sess.sends.allowAt(now, pol).After(now) {
		p := s.transport.sendQ[0]
		s.transport.sendQ[0] = nil
		s.transport.sendQ = s.transport.sendQ[1:]
		s.sess.sends.record(now, pol)
		if err := s.transport.conn.Send(p); err != nil {
			s.emit(s.line(now, "send-failed", slog.LevelWarn).err(err))
		}
	}
	if len(s.transport.sendQ) > 0 {
		s.armSendLocked(now)
	}
}

// MaxFailedResumes is how many resumes in a row may fail, each after its
// Resume went out, before the shard gives the session up and identifies: a
// failure that repeats on every resume (a replay larger than the frame
// limit) would otherwise keep it resuming forever.
const MaxFailedResumes = 3
