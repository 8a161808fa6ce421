package core

import "log/slog"

// End ends every shard's session, for a node whose plan a larger one has
// replaced (DESIGN.md section 7.5): connections close with 1000, so the
// gateway ends the sessions at once rather than keeping them for a resume
// nobody will make, nothing is saved, and the node refuses further
// commands as after Close. FATAL shards stay FATAL.
func (n *Scheduler) End() {
	if n.closed.Swap(true) {
		return
	}
	for _, s := range n.order {
		s.end()
	}
}

func (s *shard) end() {
	s.mu.Lock()
	defer s.unlock()
	if s.leaseTimer != nil {
		s.leaseTimer.Stop()
	}
	s.sess.valid = false
	if s.state == Fatal || s.state == Stopped {
		s.cancelPendingLocked()
		return
	}
	now := s.node.clock.Now()
	s.stopLocked(now, StoppedByShutdown, 1000)
	s.emit(s.line(now, "plan-replaced", slog.LevelInfo).str("state", s.state.String()).int("total", int64(s.node.plan.Total)))
}
