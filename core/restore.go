package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// StoreTimeout bounds every call the core makes to the session store.
const StoreTimeout = 5 * time.Second

// The default resume windows (DESIGN.md section 7.1): a snapshot older
// than its flavor's is not resumed.
const (
	DiscordResumeWindow = 120 * time.Second
	FluxerResumeWindow  = 60 * time.Second
)

// SnapshotSkew is how far the saver's wall clock may be ahead of the
// loader's. saved_at is the saver's clock, often another node's (a planned
// move), and no decision may rest on another node's wall clock being
// exactly right (DESIGN 7.3): a snapshot saved up to SnapshotSkew "in the
// future" is taken as just saved (age 0). Skew in either direction moves
// the resume window's check by at most the skew; a snapshot resumed a
// little past its window costs a failed resume and then an identify, the
// same as one whose session the gateway dropped early. Beyond it a clock
// is wrong and the snapshot is ignored, since its age is unknown.
const SnapshotSkew = 5 * time.Second

// loadConcurrency bounds the loads Scheduler.Start has in flight, so that 1,024
// shards cost 16 rounds of loads rather than 1,024 in a row, and a store
// that hangs on every call delays the last shard's start by at most
// len(shards)/loadConcurrency*StoreTimeout.
const loadConcurrency = 64

// errStoreTimeout is what a store call that outlived its bound returns.
type storeTimeoutError struct{ d time.Duration }

func (e storeTimeoutError) Error() string {
	return fmt.Sprintf("the session store took over %v", e.d)
}

// storeCall runs f, a call into the session store, with a context that
// ends after the node's store timeout, and returns at that deadline
// whether or not f has: a store that ignores its context cannot hold a
// shard, a start or Close. A panic in f is an error like any other.
func storeCall[T any](n *Scheduler, f func(ctx context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.storeTimeout)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				n.log.Error("session store panicked", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				done <- result{err: fmt.Errorf("the session store panicked: %v", r)}
			}
		}()
		v, err := f(ctx)
		done <- result{v, err}
	}()
	var zero T
	select {
	case r := <-done:
		if r.err != nil && ctx.Err() != nil && errors.Is(r.err, ctx.Err()) {
			return zero, storeTimeoutError{n.storeTimeout}
		}
		return r.v, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // it made the deadline after all
			if r.err == nil {
				return r.v, nil
			}
		default:
		}
		return zero, storeTimeoutError{n.storeTimeout}
	}
}

type loaded struct {
	snap Snapshot
	ok   bool
}

func (n *Scheduler) loadSnapshot(id int) (Snapshot, bool, error) {
	r, err := storeCall(n, func(ctx context.Context) (loaded, error) {
		snap, ok, err := n.sessions.Load(ctx, id)
		return loaded{snap, ok}, err
	})
	return r.snap, r.ok, err
}

func (n *Scheduler) saveSnapshot(id int, snap Snapshot) error {
	_, err := storeCall(n, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, n.sessions.Save(ctx, id, snap)
	})
	return err
}

// markUsed stores snap without its session id, so that the stored copy
// can never be resumed again (Snapshot.Used).
func (n *Scheduler) markUsed(id int, snap Snapshot) error {
	snap.Session.ID = ""
	return n.saveSnapshot(id, snap)
}

// ignoreReason says why a loaded snapshot must not be resumed, or "".
func (n *Scheduler) ignoreReason(snap Snapshot, now time.Time) string {
	switch {
	case snap.Flavor != n.flavor:
		return fmt.Sprintf("another flavor (%v; this node is %v)", snap.Flavor, n.flavor)
	case snap.Used():
		return "used"
	case snap.Total != n.plan.Total:
		return fmt.Sprintf("another total (%d; this plan has %d)", snap.Total, n.plan.Total)
	case snap.Sequence < 0:
		return fmt.Sprintf("malformed (sequence %d)", snap.Sequence)
	case snap.SavedAt.Sub(now) > SnapshotSkew:
		return fmt.Sprintf("saved_at in the future by %v, beyond the tolerated skew of %v (a clock is wrong)", snap.SavedAt.Sub(now), SnapshotSkew)
	case now.Sub(snap.SavedAt) > n.resumeWindow:
		return fmt.Sprintf("older than the resume window (age %v, window %v)", now.Sub(snap.SavedAt).Round(time.Millisecond), n.resumeWindow)
	case n.flavor == Fluxer && n.gateway == "":
		return "no gateway endpoint to check it against"
	case n.flavor == Fluxer && !sameEndpoint(snap.Session.ResumeURL, n.gateway):
		return "another gateway"
	}
	return ""
}

// sameEndpoint compares two gateway URLs by scheme, host and path; the
// query is the transport's to build from its configuration.
func sameEndpoint(a, b string) bool {
	ua, errA := url.Parse(a)
	ub, errB := url.Parse(b)
	if errA != nil || errB != nil {
		return false
	}
	return strings.EqualFold(ua.Scheme, ub.Scheme) && strings.EqualFold(ua.Host, ub.Host) &&
		strings.TrimRight(ua.Path, "/") == strings.TrimRight(ub.Path, "/")
}

// prepareAll runs prepareStart for every target, at most loadConcurrency at
// a time, and then, in target order, each target's start as soon as its
// own preparation and those before it are done, so that identify slots are
// still requested in shard order. Each shard's store lock is held from its
// preparation to the end of its start.
func (n *Scheduler) prepareAll(targets []*shard, nodeStart bool, start func(*shard)) {
	done := make([]chan struct{}, len(targets))
	for i := range done {
		done[i] = make(chan struct{})
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(loadConcurrency, len(targets)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				targets[i].storeMu.Lock()
				targets[i].prepareStart(nodeStart)
				close(done[i])
			}
		}()
	}
	go func() {
		for i := range targets {
			work <- i
		}
		close(work)
	}()
	for i, s := range targets {
		<-done[i]
		start(s)
		s.storeMu.Unlock()
	}
	wg.Wait()
}

// prepareStart, called with storeMu held before a shard starts, loads the
// shard's snapshot the first time, or marks used the copy its own clean
// stop saved, so that whatever it resumes has no resumable copy left. It
// does neither for a shard the start will not start (Scheduler.Start starts
// only ASSIGNED shards), so that the store keeps what nothing resumes.
func (s *shard) prepareStart(nodeStart bool) {
	if s.node.closed.Load() {
		return
	}
	s.mu.Lock()
	startable := s.state == Assigned && !s.leaseBlocks(s.node.clock.Now())
	if !nodeStart {
		startable = s.checkLocked(VerbStart, s.node.clock.Now()) == nil
	}
	load := startable && !s.store.loadDone && !s.sess.session.exists()
	if startable {
		s.store.loadDone = true
	}
	mark := startable && s.store.stored && s.resumable()
	var snap Snapshot
	if mark {
		snap = s.snapshotLocked(s.store.storedAt)
	}
	s.mu.Unlock()
	switch {
	case load:
		s.restore()
	case mark:
		s.markStoredUsed(snap)
	}
}

// restore loads the shard's snapshot and, when every rule of DESIGN.md
// section 7.1 allows it, marks the stored copy used and only then gives the
// session to the shard, which resumes it when it starts.
func (s *shard) restore() {
	n := s.node
	snap, ok, err := n.loadSnapshot(s.id)
	now := n.clock.Now()
	if err != nil {
		s.emit(s.line(now, "snapshot-error", slog.LevelError).str("op", "load").err(err).str("then", "new session"))
		return
	}
	if !ok {
		return
	}
	if why := n.ignoreReason(snap, now); why != "" {
		s.emit(s.line(now, "snapshot-ignored", slog.LevelWarn).str("reason", why).str("then", "new session"))
		return
	}
	age := max(0, now.Sub(snap.SavedAt)) // within SnapshotSkew: the saver's clock is ahead
	if err := n.markUsed(s.id, snap); err != nil {
		// The stored copy may still be resumable: resuming now could
		// make a second resume of it possible later.
		s.emit(s.line(n.clock.Now(), "snapshot-error", slog.LevelError).str("op", "mark-used").err(err).str("then", "new session"))
		return
	}
	s.mu.Lock()
	defer s.unlock()
	now = n.clock.Now()
	if s.sess.session.exists() || s.state != Assigned && s.state != Stopped {
		s.emit(s.line(now, "snapshot-ignored", slog.LevelWarn).str("reason", "the shard started before its snapshot loaded"))
		return
	}
	s.sess.session, s.sess.valid = snap.Session, true
	s.sess.seq, s.sess.seqValid = snap.Sequence, true
	s.store.restored, s.store.restoredAge = true, age
	s.emit(s.line(now, "snapshot-loaded", slog.LevelInfo).int("age_ms", age.Milliseconds()).int("sequence", snap.Sequence))
}

// markStoredUsed marks used the snapshot the shard's clean stop saved,
// before the shard resumes that session again; if the mark fails the
// shard identifies instead.
func (s *shard) markStoredUsed(snap Snapshot) {
	err := s.node.markUsed(s.id, snap)
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	if err != nil {
		s.sess.valid = false
		s.emit(s.line(now, "snapshot-error", slog.LevelError).str("op", "mark-used").err(err).str("then", "new session"))
		return
	}
	s.store.stored = false
}

// snapshotLocked is the shard's session as the store keeps it.
func (s *shard) snapshotLocked(at time.Time) Snapshot {
	return Snapshot{Flavor: s.node.flavor, Session: s.sess.session, Sequence: s.sess.seq, Total: s.node.plan.Total, SavedAt: at}
}

// toSave returns the snapshot a clean stop leaves, if the shard has one to
// leave: stopped by the operator or by shutdown (its socket closed with
// 4000), with a valid session and sequence not saved yet.
func (s *shard) toSave() (Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clean := s.state == Stopped && (s.stopReason == StoppedByOperator || s.stopReason == StoppedByShutdown || s.stopReason == StoppedByMove)
	if !clean || !s.resumable() || s.store.stored {
		return Snapshot{}, false
	}
	return s.snapshotLocked(s.node.clock.Now()), true
}

// save stores a clean stop's snapshot; storeMu is held.
func (s *shard) save(snap Snapshot) {
	err := s.node.saveSnapshot(s.id, snap)
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	var timeout storeTimeoutError
	if err != nil {
		// A save that outlived its bound may still land: count it as
		// stored, so that a start marks it used before resuming.
		s.store.stored, s.store.storedAt = errors.As(err, &timeout), snap.SavedAt
		s.emit(s.line(now, "snapshot-error", slog.LevelError).str("op", "save").err(err))
		return
	}
	s.store.stored, s.store.storedAt = true, snap.SavedAt
	s.emit(s.line(now, "snapshot-saved", slog.LevelInfo).int("sequence", snap.Sequence))
}

// stopAndSave stops each target like the stop command (or shutdown when
// stop is nil) and saves the snapshots of those whose session stays
// resumable, all at once, and returns when every save has ended.
func (n *Scheduler) stopAndSave(targets []*shard, stop func(*shard)) {
	var wg sync.WaitGroup
	for _, s := range targets {
		s.storeMu.Lock()
		stop(s)
		snap, ok := s.toSave()
		if !ok {
			s.storeMu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.storeMu.Unlock()
			s.save(snap)
		}()
	}
	wg.Wait()
}
