package gatewaysim

import (
	"strconv"
	"time"
)

// handle processes one client payload and reports it to Config.OnFrame.
// It returns errStop once the server has decided to close the connection.
func (c *conn) handle(data []byte) error {
	if c.s.cfg.OnFrame == nil {
		return c.command(data, nil)
	}
	f := Frame{Conn: c.id, Remote: c.remote, Op: -1, Shard: -1}
	err := c.command(data, &f)
	c.s.cfg.OnFrame(f)
	return err
}

// command processes one client payload; when rec is set it fills in what
// the payload was about.
func (c *conn) command(data []byte, rec *Frame) error {
	s := c.s
	cmd, err := parseCommand(data)
	if err != nil {
		if rec != nil {
			rec.At = s.clock.Now()
			s.mu.Lock()
			rec.Shard = c.shardLocked()
			s.mu.Unlock()
		}
		c.close(CloseDecodeError, "Decode error.")
		return errStop
	}
	// Decode the command's data before locking; the rules that judge it
	// need the session state.
	var (
		id      identifyData
		rd      resumeData
		seq     int64
		decoded = true
	)
	switch cmd.Op {
	case opHeartbeat:
		seq, decoded = parseSeq(cmd.D)
	case opIdentify:
		decoded = decodeObject(cmd.D, &id) == nil
	case opResume:
		decoded = decodeObject(cmd.D, &rd) == nil
		if decoded {
			seq, decoded = parseSeq(rd.Seq)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.changes.notify()
	now := s.clock.Now()
	c.heardLocked()
	if rec != nil {
		rec.Op, rec.At = cmd.Op, now
		// The shard as the server knew it on receipt: the session's, or
		// the one an identify or resume names.
		rec.Shard = c.shardLocked()
		switch {
		case rec.Shard >= 0:
		case cmd.Op == opIdentify:
			if n, _, ok := parseShard(id.Shard); ok {
				rec.Shard = n
			}
		case cmd.Op == opResume:
			if sess := s.sessions[rd.SessionID]; sess != nil {
				rec.Shard = sess.sh.id
			}
		}
	}
	if c.closing || c.finished {
		return errStop
	}
	if !c.spend(now) {
		c.closeLocked(CloseRateLimited, "You are being rate limited.")
		return errStop
	}
	if !clientOp(s.cfg.Flavor, cmd.Op) {
		c.closeLocked(CloseUnknownOpcode, "Unknown opcode.")
		return errStop
	}
	if !decoded {
		c.closeLocked(CloseDecodeError, "Decode error.")
		return errStop
	}
	switch cmd.Op {
	case opHeartbeat:
		c.heartbeatLocked(seq)
	case opIdentify:
		c.identifyLocked(id, now)
	case opResume:
		c.resumeLocked(rd, seq)
	default:
		// Presence, voice state, member requests and the like are
		// accepted and ignored once authenticated.
		if c.sess == nil {
			c.closeLocked(CloseNotAuthenticated, "Not authenticated.")
		}
	}
	if c.closing {
		return errStop
	}
	return nil
}

// shardLocked is the shard of the connection's session, or -1. s.mu must
// be held.
func (c *conn) shardLocked() int {
	if c.sess != nil {
		return c.sess.sh.id
	}
	return -1
}

// heartbeatLocked answers a heartbeat. On Fluxer its sequence is what the
// client has processed: the replay buffer is trimmed to it, and a sequence
// the server never sent closes 4007.
func (c *conn) heartbeatLocked(seq int64) {
	s := c.s
	c.armHeartbeatLocked()
	if sess := c.sess; sess != nil {
		sess.sh.heartbeats.Add(1)
		if seq >= 0 {
			if s.cfg.Flavor == Fluxer {
				if seq > sess.seq {
					c.closeLocked(CloseInvalidSeq, "Invalid sequence")
					return
				}
				sess.replay.trimThrough(seq)
			}
			sess.acked = seq
		}
	}
	if !c.noAcks {
		c.enqueue(frame{kind: framePayload, data: heartbeatACK})
	}
}

// identifyLocked judges an Identify in the order the close codes are
// documented, then applies the identify rate limits, then starts a session.
func (c *conn) identifyLocked(d identifyData, now time.Time) {
	s := c.s
	if c.sess != nil {
		c.closeLocked(CloseAlreadyAuthenticated, "Already authenticated.")
		return
	}
	if !s.tokenOKLocked(d.Token) {
		c.closeLocked(CloseAuthenticationFailed, "Authentication failed.")
		return
	}
	shardID, total, ok := parseShard(d.Shard)
	if !ok || s.cfg.ShardingRequired && total != int(s.recommended.Load()) {
		c.closeLocked(CloseInvalidShard, "Invalid shard.")
		return
	}
	if s.guildCount(shardID, total) > MaxGuildsPerShard {
		c.closeLocked(CloseShardingRequired, "Sharding required.")
		return
	}
	var intents uint64
	if s.cfg.Flavor == Discord {
		intents, ok = parseIntents(d.Intents)
		if !ok || intents&^ValidIntents != 0 {
			c.closeLocked(CloseInvalidIntents, "Invalid intent(s).")
			return
		}
		if intents&s.cfg.DeniedIntents&PrivilegedIntents != 0 {
			c.closeLocked(CloseDisallowedIntents, "Disallowed intent(s).")
			return
		}
	}
	sh := s.shardLocked(shardID)
	if s.cfg.Flavor == Discord {
		bucket := shardID % s.cfg.MaxConcurrency
		if last, ok := s.buckets[bucket]; ok && now.Sub(last) < s.cfg.IdentifyInterval-s.cfg.IdentifyTolerance {
			sh.refused.Add(1)
			c.enqueue(frame{kind: framePayload, data: invalidSessionNo})
			return
		}
		s.refreshStartLimit(now)
		if s.startUsed >= s.cfg.SessionStartLimit {
			// Discord terminates every session and resets the token of a
			// bot that exceeds its daily identifies.
			s.log.Warn("session start limit exhausted: token revoked")
			s.revokeTokenLocked()
			return
		}
		s.buckets[bucket] = now
		if s.startBegin.IsZero() {
			s.startBegin = now
		}
		s.startUsed++
	} else if !s.identifyBudgetLocked(now) {
		// Fluxer drops an identify over its budget without an answer.
		sh.refused.Add(1)
		return
	}
	sess := s.newSessionLocked(sh, total, intents)
	s.attachLocked(sess, c)
	sh.identifies.Add(1)
	s.log.Debug("gateway session started", "shard", shardID, "total", total)
	s.sequenceLocked(sess, "READY", s.readyData(sess, c.version), true)
	if s.cfg.Flavor == Fluxer || intents&IntentGuilds != 0 {
		s.eachGuild(shardID, total, func(g uint64) {
			s.sequenceLocked(sess, "GUILD_CREATE", guildCreateData(g), true)
		})
	}
}

func (s *Server) tokenOKLocked(raw []byte) bool {
	tok, ok := parseToken(raw)
	return ok && !s.tokenRevoked && tok == s.token
}

// identifyBudgetLocked spends one of Fluxer's identifies in the rolling
// window, if any is left. s.mu must be held.
func (s *Server) identifyBudgetLocked(now time.Time) bool {
	cutoff := now.Add(-s.cfg.IdentifyBudgetWindow)
	i := 0
	for i < len(s.identifyLog) && !s.identifyLog[i].After(cutoff) {
		i++
	}
	s.identifyLog = s.identifyLog[i:]
	if len(s.identifyLog) >= s.cfg.IdentifyBudget {
		return false
	}
	s.identifyLog = append(s.identifyLog, now)
	return true
}

// revokeTokenLocked ends every session and refuses the token until SetToken.
// s.mu must be held.
func (s *Server) revokeTokenLocked() {
	s.tokenRevoked = true
	for c := range s.conns {
		c.closeLocked(CloseAuthenticationFailed, "Authentication failed.")
	}
	for _, sess := range s.sessions {
		s.endSessionLocked(sess)
	}
}

// resumeLocked resumes a session: it replays what the client missed and
// sends RESUMED. On Discord a session whose missed events are no longer all
// retained cannot be resumed; Fluxer replays what it kept, gaps included.
func (c *conn) resumeLocked(d resumeData, seq int64) {
	s := c.s
	if c.sess != nil {
		c.closeLocked(CloseAlreadyAuthenticated, "Already authenticated.")
		return
	}
	if !s.tokenOKLocked(d.Token) {
		c.closeLocked(CloseAuthenticationFailed, "Authentication failed.")
		return
	}
	sess := s.sessions[d.SessionID]
	if sess == nil || sess.ended {
		s.stats.unknownResumes++
		c.enqueue(frame{kind: framePayload, data: invalidSessionNo})
		return
	}
	sh := sess.sh
	if seq > sess.seq {
		sh.failedResumes.Add(1)
		c.closeLocked(CloseInvalidSeq, "Invalid seq.")
		if sess.conn == nil {
			s.endSessionLocked(sess)
		}
		return
	}
	from := max(seq, 0)
	var gaps, missed int64
	next := from + 1
	var replay []retained
	sess.replay.each(func(e retained) {
		if e.seq <= from {
			return
		}
		if e.seq > next {
			gaps++
			missed += e.seq - next
		}
		next = e.seq + 1
		replay = append(replay, e)
	})
	if next <= sess.seq {
		gaps++
		missed += sess.seq - next + 1
	}
	if gaps > 0 && s.cfg.Flavor == Discord {
		// A failed resume invalidates the session, but not under a
		// connection that is still using it.
		sh.failedResumes.Add(1)
		if sess.conn == nil {
			s.endSessionLocked(sess)
		}
		c.enqueue(frame{kind: framePayload, data: invalidSessionNo})
		return
	}
	if old := sess.conn; old != nil {
		// Resuming a session still attached elsewhere takes it over.
		s.detachLocked(sess)
		old.closeLocked(CloseUnknownError, "Session resumed on another connection.")
	}
	s.attachLocked(sess, c)
	for _, e := range replay {
		c.enqueue(frame{kind: frameDispatch, seq: e.seq, name: e.name, data: e.data, sess: sess})
	}
	c.enqueue(frame{kind: frameDispatch, seq: -1, name: "RESUMED", data: []byte("{}"), sess: sess})
	if seq >= 0 {
		sess.acked = seq
	}
	sh.resumes.Add(1)
	sh.replayed.Add(int64(len(replay)))
	sh.gaps.Add(gaps)
	sh.missed.Add(missed)
	s.log.Debug("gateway session resumed", "shard", sh.id, "replayed", len(replay), "gaps", gaps, "via_resume_url", c.viaResume)
}

// readyData builds the READY payload of a new session on a connection of
// the given gateway version.
func (s *Server) readyData(sess *session, version int) []byte {
	b := make([]byte, 0, 256+40*s.guildCount(sess.sh.id, sess.total))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(version), 10)
	b = append(b, `,"user":{"id":"`...)
	b = strconv.AppendUint(b, botUserID, 10)
	b = append(b, `","username":"shardfs-sim","discriminator":"0","global_name":null,"avatar":null,"bot":true},"guilds":[`...)
	first := true
	s.eachGuild(sess.sh.id, sess.total, func(g uint64) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `{"id":"`...)
		b = strconv.AppendUint(b, g, 10)
		b = append(b, `","unavailable":true}`...)
	})
	b = append(b, `],"session_id":"`...)
	b = append(b, sess.id...)
	b = append(b, '"')
	if s.cfg.Flavor == Discord {
		b = append(b, `,"resume_gateway_url":"`...)
		b = append(b, s.ResumeURL()...)
		b = append(b, '"')
	}
	b = append(b, `,"shard":[`...)
	b = strconv.AppendInt(b, int64(sess.sh.id), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(sess.total), 10)
	b = append(b, `],"application":{"id":"`...)
	b = strconv.AppendUint(b, botUserID, 10)
	b = append(b, `","flags":0}}`...)
	return b
}
