package gatewaysim

import (
	"crypto/rand"
	"encoding/hex"
	"sort"
	"sync/atomic"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// retained is one dispatch kept for replay.
type retained struct {
	seq  int64
	name string
	data []byte // shared between the sessions the event went to
	at   int64  // clock time in Unix nanoseconds
}

// replayRing keeps the newest dispatches of a session, oldest first; it
// grows on demand up to its limit so that an idle session costs little.
type replayRing struct {
	buf   []retained
	start int
	n     int
}

func (r *replayRing) push(e retained, limit int) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = e
		r.n++
		return
	}
	if len(r.buf) < limit {
		// Grow by copying into order, so that start is 0 again.
		grown := make([]retained, 0, min(limit, max(8, 2*len(r.buf))))
		r.each(func(x retained) { grown = append(grown, x) })
		grown = append(grown, e)
		r.buf, r.start, r.n = grown[:cap(grown)], 0, len(grown)
		return
	}
	r.buf[r.start] = e
	r.start = (r.start + 1) % len(r.buf)
}

func (r *replayRing) front() (retained, bool) {
	if r.n == 0 {
		return retained{}, false
	}
	return r.buf[r.start], true
}

func (r *replayRing) popFront() {
	r.buf[r.start] = retained{}
	r.start = (r.start + 1) % len(r.buf)
	r.n--
}

// trimThrough drops every dispatch up to and including seq.
func (r *replayRing) trimThrough(seq int64) {
	for {
		e, ok := r.front()
		if !ok || e.seq > seq {
			return
		}
		r.popFront()
	}
}

// dropBefore drops dispatches retained before the cutoff, which no resume
// within the window can still need from a connected client.
func (r *replayRing) dropBefore(cutoff int64) {
	for {
		e, ok := r.front()
		if !ok || e.at >= cutoff {
			return
		}
		r.popFront()
	}
}

func (r *replayRing) each(f func(retained)) {
	for i := 0; i < r.n; i++ {
		f(r.buf[(r.start+i)%len(r.buf)])
	}
}

// session is a gateway session: a sequence, its replay buffer and the
// connection it is attached to, if any.
type session struct {
	id      string
	sh      *shard
	total   int
	intents uint64

	// Guarded by Server.mu.
	seq        int64 // last sequence assigned
	acked      int64 // last sequence the client reported; -1 for none
	replay     replayRing
	conn       *conn
	expiry     clock.Timer
	detachedAt time.Time
	ended      bool

	sent atomic.Int64 // last sequence written to a connection
}

// shard holds the sessions and counters of one shard id; sessions with
// different totals share it.
type shard struct {
	id       int
	sessions []*session // live or resumable
	faults   stickyFaults
	acc      float64 // traffic owed but not yet generated

	identifies    atomic.Int64
	refused       atomic.Int64
	resumes       atomic.Int64
	failedResumes atomic.Int64
	replayed      atomic.Int64
	gaps          atomic.Int64
	missed        atomic.Int64
	heartbeats    atomic.Int64
	live          atomic.Int64
	maxLive       atomic.Int64
	published     atomic.Int64
	dispatched    atomic.Int64
}

type serverCounters struct {
	connections    int64
	unknownResumes int64
}

// ShardStats are the counters of one shard id.
type ShardStats struct {
	Identifies        int64 // identifies answered with READY
	RefusedIdentifies int64 // identifies answered with op 9 or dropped (Fluxer budget)
	Resumes           int64 // resumes answered with RESUMED
	FailedResumes     int64 // resumes answered with op 9
	ReplayedEvents    int64 // dispatches replayed by resumes
	SequenceGaps      int64 // discontinuities a resuming client was left with
	MissedEvents      int64 // sequences inside those discontinuities
	Heartbeats        int64 // heartbeats received
	LiveSessions      int64 // sessions attached to a connection now
	MaxLiveSessions   int64 // most sessions attached at once, ever
	Published         int64 // events routed to the shard (traffic, Publish, Flood)
	Dispatched        int64 // dispatch frames written to the shard's connections, replays and READY included
}

func (sh *shard) snapshot() ShardStats {
	return ShardStats{
		Identifies:        sh.identifies.Load(),
		RefusedIdentifies: sh.refused.Load(),
		Resumes:           sh.resumes.Load(),
		FailedResumes:     sh.failedResumes.Load(),
		ReplayedEvents:    sh.replayed.Load(),
		SequenceGaps:      sh.gaps.Load(),
		MissedEvents:      sh.missed.Load(),
		Heartbeats:        sh.heartbeats.Load(),
		LiveSessions:      sh.live.Load(),
		MaxLiveSessions:   sh.maxLive.Load(),
		Published:         sh.published.Load(),
		Dispatched:        sh.dispatched.Load(),
	}
}

// SessionInfo describes one live or resumable session. The session id is
// left out on purpose: it is a secret of the client.
type SessionInfo struct {
	Shard, Total int
	Intents      uint64
	Seq          int64 // last sequence assigned
	Sent         int64 // last sequence written to a connection
	Acked        int64 // last sequence the client reported, -1 for none
	Retained     int   // dispatches kept for replay
	Live         bool  // attached to a connection
}

// Stats returns the counters of a shard id.
func (s *Server) Stats(shardID int) ShardStats {
	s.mu.Lock()
	sh := s.shards[shardID]
	s.mu.Unlock()
	if sh == nil {
		return ShardStats{}
	}
	return sh.snapshot()
}

// AllStats returns the counters of every shard id that has been used.
func (s *Server) AllStats() map[int]ShardStats {
	s.mu.Lock()
	shards := make([]*shard, 0, len(s.shards))
	for _, sh := range s.shards {
		shards = append(shards, sh)
	}
	s.mu.Unlock()
	out := make(map[int]ShardStats, len(shards))
	for _, sh := range shards {
		out[sh.id] = sh.snapshot()
	}
	return out
}

// Totals sums the counters of every shard; MaxLiveSessions is the largest of
// any one shard, so that a value above 1 means a duplicate session existed.
// Failed resumes of unknown sessions, which belong to no shard, are
// included.
func (s *Server) Totals() ShardStats {
	var t ShardStats
	for _, st := range s.AllStats() {
		t.Identifies += st.Identifies
		t.RefusedIdentifies += st.RefusedIdentifies
		t.Resumes += st.Resumes
		t.FailedResumes += st.FailedResumes
		t.ReplayedEvents += st.ReplayedEvents
		t.SequenceGaps += st.SequenceGaps
		t.MissedEvents += st.MissedEvents
		t.Heartbeats += st.Heartbeats
		t.LiveSessions += st.LiveSessions
		t.MaxLiveSessions = max(t.MaxLiveSessions, st.MaxLiveSessions)
		t.Published += st.Published
		t.Dispatched += st.Dispatched
	}
	s.mu.Lock()
	t.FailedResumes += s.stats.unknownResumes
	s.mu.Unlock()
	return t
}

// Sessions describes the live and resumable sessions of a shard id, oldest
// first.
func (s *Server) Sessions(shardID int) []SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.shards[shardID]
	if sh == nil {
		return nil
	}
	out := make([]SessionInfo, 0, len(sh.sessions))
	for _, sess := range sh.sessions {
		out = append(out, SessionInfo{
			Shard:    sh.id,
			Total:    sess.total,
			Intents:  sess.intents,
			Seq:      sess.seq,
			Sent:     sess.sent.Load(),
			Acked:    sess.acked,
			Retained: sess.replay.n,
			Live:     sess.conn != nil,
		})
	}
	return out
}

// ShardIDs lists the shard ids that have been used, in order.
func (s *Server) ShardIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int, 0, len(s.shards))
	for id := range s.shards {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// shardLocked returns the state of a shard id, creating it. s.mu must be
// held.
func (s *Server) shardLocked(id int) *shard {
	sh := s.shards[id]
	if sh == nil {
		sh = &shard{id: id}
		s.shards[id] = sh
		s.shardList = append(s.shardList, sh)
	}
	return sh
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newSessionLocked creates a session for a shard. s.mu must be held.
func (s *Server) newSessionLocked(sh *shard, total int, intents uint64) *session {
	sess := &session{id: newSessionID(), sh: sh, total: total, intents: intents, acked: -1}
	s.sessions[sess.id] = sess
	sh.sessions = append(sh.sessions, sess)
	return sess
}

// attachLocked makes c the connection of sess. s.mu must be held.
func (s *Server) attachLocked(sess *session, c *conn) {
	if sess.expiry != nil {
		sess.expiry.Stop()
	}
	sess.conn = c
	c.sess = sess
	c.applyFaultsLocked()
	c.quiet = false
	liveLocked(sess.sh)
	c.armQuietLocked()
	s.changes.notify()
}

// detachLocked separates sess from its connection and keeps it resumable for
// the resume window. s.mu must be held.
func (s *Server) detachLocked(sess *session) {
	if sess.conn == nil {
		return
	}
	if !sess.conn.quiet {
		sess.sh.live.Add(-1)
	}
	sess.conn.quiet = false
	sess.conn.sess = nil
	sess.conn = nil
	if sess.ended {
		return
	}
	sess.detachedAt = s.clock.Now()
	if sess.expiry == nil {
		sess.expiry = s.after(s.cfg.ResumeWindow, func() { s.expire(sess) })
	} else {
		sess.expiry.Reset(s.cfg.ResumeWindow)
	}
	s.changes.notify()
}

func (s *Server) expire(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.ended || sess.conn != nil {
		return
	}
	if left := sess.detachedAt.Add(s.cfg.ResumeWindow).Sub(s.clock.Now()); left > 0 {
		sess.expiry.Reset(left)
		return
	}
	s.endSessionLocked(sess)
}

// endSessionLocked ends sess for good: it can no longer be resumed. s.mu
// must be held.
func (s *Server) endSessionLocked(sess *session) {
	if sess.ended {
		return
	}
	sess.ended = true
	s.detachLocked(sess)
	if sess.expiry != nil {
		sess.expiry.Stop()
	}
	delete(s.sessions, sess.id)
	list := sess.sh.sessions
	for i, x := range list {
		if x == sess {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			sess.sh.sessions = list[:len(list)-1]
			break
		}
	}
	sess.replay = replayRing{}
	s.changes.notify()
}

// sequenceLocked gives the next sequence of sess to a dispatch, retains it
// for replay when asked, and queues it on the attached connection. s.mu
// must be held; holding it across the queueing keeps every connection's
// dispatches in sequence order.
func (s *Server) sequenceLocked(sess *session, name string, data []byte, retain bool) int64 {
	sess.seq++
	if retain {
		now := s.clock.Now().UnixNano()
		sess.replay.dropBefore(now - int64(s.cfg.ResumeWindow))
		sess.replay.push(retained{seq: sess.seq, name: name, data: data, at: now}, s.cfg.ReplayLimit)
	}
	if c := sess.conn; c != nil {
		c.enqueue(frame{kind: frameDispatch, seq: sess.seq, name: name, data: data, sess: sess})
	}
	return sess.seq
}
