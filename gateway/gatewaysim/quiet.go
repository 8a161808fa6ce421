package gatewaysim

// Quiet sessions (Config.QuietAfter): a client that stops writing (a
// paused process) keeps its connection open at the gateway until the
// heartbeat timeout, as Discord does; its session leaves LiveSessions
// meanwhile and comes back, counted in MaxLiveSessions, at its next frame.

// heardLocked notes a frame from the client. s.mu must be held.
func (c *conn) heardLocked() {
	s := c.s
	if s.cfg.QuietAfter <= 0 {
		return
	}
	c.heardAt = s.clock.Now()
	if c.quiet && c.sess != nil {
		c.quiet = false
		liveLocked(c.sess.sh)
		s.changes.notify()
	}
	c.armQuietLocked()
}

// liveLocked counts one more live session of sh.
func liveLocked(sh *shard) {
	if live := sh.live.Add(1); live > sh.maxLive.Load() {
		sh.maxLive.Store(live)
	}
}

func (c *conn) armQuietLocked() {
	s := c.s
	if s.cfg.QuietAfter <= 0 || c.finished {
		return
	}
	if c.quietT == nil {
		c.quietT = s.after(s.cfg.QuietAfter, c.quietDue)
	} else {
		c.quietT.Reset(s.cfg.QuietAfter)
	}
}

// quietDue takes the connection's session out of LiveSessions when the
// client has been silent for QuietAfter.
func (c *conn) quietDue() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.finished || c.quiet || c.sess == nil {
		return
	}
	if left := c.heardAt.Add(s.cfg.QuietAfter).Sub(s.clock.Now()); left > 0 {
		c.quietT.Reset(left)
		return
	}
	c.quiet = true
	c.sess.sh.live.Add(-1)
	s.changes.notify()
}
