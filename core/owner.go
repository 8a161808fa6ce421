package core

import (
	"log/slog"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// Ownership across nodes (lease/etcd) reaches the core as lease grants
// with Owner set; see LeaseGrant. The core keeps a shard context for every
// candidate shard of the node (its plan's local shards) and runs those it
// is granted:
//
//   - A candidate no one granted to this node is STOPPED, reason "not
//     owned" (grant NotOwned); the tree shows only owned shards in /status
//     and the root listing, and the /N directory of a candidate stays
//     reachable by name.
//   - A grant of a new generation to a shard that a lost lease, a move or
//     non-ownership stopped first forgets the session the shard held (the
//     previous owner may have resumed it since) and loads the snapshot
//     from the session store again, marks it used and resumes it; without
//     a resumable snapshot the shard identifies.
//   - A lease that passes its deadline stops the shard with reason "lease
//     lost", saving nothing: another node may own the shard by then. A
//     grant of a new generation marked Continues (no other owner in
//     between, proved by the ownership layer) keeps the session in memory
//     and resumes it: an etcd outage costs no identify.
//   - Handover is the planned move: stop with 4000 (reason "moved"), save
//     the snapshot, and return once it is saved.

// SetLease applies a lease grant to its shard: a lease whose deadline has
// passed stops the shard, and a valid or disabled lease restarts the shard
// if an expiry stopped it. Grants for unknown shards are ignored. An
// ownership grant of a new generation reloads the shard's snapshot first
// (see Ownership above), so SetLease may wait for the session store.
func (n *Scheduler) SetLease(g LeaseGrant) {
	s := n.shards[g.Shard]
	if s == nil {
		return
	}
	if g.Owner && n.sessions != nil && g.Generation != 0 && !s.holds(g) {
		s.storeMu.Lock()
		defer s.storeMu.Unlock()
		if s.takeOwnership(g) {
			s.restore()
		}
	}
	s.setLease(g)
}

// holds reports whether the shard already has g's generation: a renewal,
// which must not wait for the shard's store calls.
func (s *shard) holds(g LeaseGrant) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease.Owner && s.lease.Generation == g.Generation
}

// takeOwnership prepares a shard for a grant of a new generation: it
// forgets the in-memory session of an earlier ownership and reports
// whether the snapshot must be loaded.
func (s *shard) takeOwnership(g LeaseGrant) bool {
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	if g.Generation == s.lease.Generation && s.lease.Owner {
		return false
	}
	if !g.Deadline.IsZero() && !now.Before(g.Deadline) {
		return false
	}
	if s.node.closed.Load() {
		return false
	}
	switch {
	case s.state == Assigned:
		// Scheduler.Start has not run: it loads the snapshot itself, unless
		// this grant comes after a NotOwned one blocked its load.
		if !s.leaseBlocks(now) {
			return false
		}
	case g.Continues && s.state == Stopped && s.stopReason == StoppedByLeaseLost && s.resumable():
		// Nobody else owned the shard since its lease was lost here: the
		// session in memory is the newest there is, and the stored copy
		// was marked used when this node loaded it (a lost lease saves
		// nothing), so no other node can have resumed it.
		s.emit(s.line(now, "session-kept", slog.LevelInfo).str("reason", "no other owner since the lease was lost").int("generation", int64(g.Generation)))
		return false
	case s.state == Stopped && s.stopReason.byLease():
	default:
		return false
	}
	if s.sess.session.exists() {
		s.emit(s.line(now, "session-dropped", slog.LevelInfo).str("reason", "new owner generation").int("generation", int64(g.Generation)))
	}
	s.sess.session, s.sess.valid = Session{}, false
	s.sess.seq, s.sess.seqValid = 0, false
	s.store = storeState{loadDone: true}
	return true
}

// Handover is the planned move of shard id to another node: it stops the
// shard with close code 4000 (reason "moved"), saves its snapshot when the
// session stays resumable, and returns once the save has ended and the
// old connection has stopped writing (see Ender), reporting whether a
// snapshot was saved. The shard's lease counts as expired from then on,
// and its connections' fence no longer moves: only a grant of a new
// generation starts it again.
func (n *Scheduler) Handover(id int) (saved bool, err error) {
	s, err := n.shard(id)
	if err != nil {
		return false, err
	}
	// The fence the current connection writes under: handover drops the
	// shard's reference, and a handover that waits too long cuts it.
	s.mu.Lock()
	fence := s.fence
	s.mu.Unlock()
	if n.sessions == nil {
		s.handover()
	} else {
		n.stopAndSave([]*shard{s}, (*shard).handover)
		s.mu.Lock()
		saved = s.store.stored
		s.mu.Unlock()
	}
	// The connection handover closed, or the one an earlier stop, fence or
	// failure closed and which may still be sending its close frame.
	s.mu.Lock()
	old := s.closed
	s.mu.Unlock()
	s.awaitEnded(old, fence)
	return saved, nil
}

// HandoverWait bounds how long Handover waits for the old connection to
// stop writing: the gateway client's close handshake (its close frame, then
// up to 2 s for the gateway's answer) fits in it.
const HandoverWait = 5 * time.Second

// awaitEnded waits until c, the shard's connection before a handover, can
// write no more, so that the caller releases the shard's key only then:
// a heartbeat or close frame that was on its way when the connection was
// closed must not reach the gateway after the new owner has started
// (seen in the failover soak under load: a heartbeat read 1 s after the
// release). A connection that is not an Ender is not waited for. One that
// takes longer than HandoverWait (a close can take 12 s) is fenced now,
// so it writes nothing more, and its socket closed (Aborter), then said:
// the key must not go to another node while it could still write.
func (s *shard) awaitEnded(c Conn, fence *Fence) {
	e, ok := c.(Ender)
	if !ok {
		return
	}
	late := make(chan struct{})
	t := s.node.clock.AfterFunc(HandoverWait, func() { close(late) })
	defer t.Stop()
	select {
	case <-e.Ended():
	case <-late:
		if fence != nil {
			fence.set(clock.Mono(s.node.clock), s.node.clock.Now())
		}
		if a, ok := c.(Aborter); ok {
			a.Abort()
		}
		s.mu.Lock()
		s.emit(s.line(s.node.clock.Now(), "handover-slow", slog.LevelWarn).str("reason", "the old connection was still open after "+HandoverWait.String()+"; fenced and its socket closed"))
		s.unlock()
	}
}

func (s *shard) handover() {
	s.mu.Lock()
	defer s.unlock()
	now := s.node.clock.Now()
	if s.leaseTimer != nil {
		s.leaseTimer.Stop()
	}
	switch s.state {
	case Fatal:
		s.cancelPendingLocked()
	case Stopped:
		s.cancelPendingLocked()
		if s.stopReason != StoppedByShutdown {
			s.stopReason = StoppedByMove
		}
	default:
		s.stopLocked(now, StoppedByMove, 4000)
	}
	s.leaseExpire = true
	if s.lease.Deadline.IsZero() {
		s.lease.Deadline = now
	}
	s.fence = nil // the old connection keeps the fence it had; it moves no more
}

// Owned reports whether the shard's lease lets it run: it holds a valid
// grant or none is enforced. Unowned candidates of an etcd node report
// false.
func (d Diag) Owned() bool {
	if d.Lease.Owner {
		return d.Lease.Generation != 0 && !d.LeaseExpired
	}
	return true
}
