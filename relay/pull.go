package relay

import (
	"encoding/json"

	"github.com/shardfs/shardfs/wire"
)

// startPuller starts the goroutine that sends the client the shard's
// dispatches from its session's cursor on; resumed sends RESUMED once the
// replay is done.
func (c *conn) startPuller(resumed bool) {
	c.pmu.Lock()
	done := make(chan struct{})
	c.pulling = done
	c.pmu.Unlock()
	go func() {
		defer close(done)
		c.pull(resumed)
	}()
}

// pull reads the journal from the session's cursor and writes every
// dispatch the client's intents cover, with the client's own sequence
// numbers, until the connection ends.
func (c *conn) pull(resumed bool) {
	sess := c.sess
	log := sess.log.log
	sess.mu.Lock()
	rd := lineReader{off: sess.cursor.off}
	lines := sess.cursor.lines
	sess.mu.Unlock()
	var frame []byte
	names := typeNames{}
	for {
		ch := log.Notify()
		p, lost := rd.next(log)
		if lost {
			// The client read slower than the shard's retention: what it
			// missed is gone, so its session is too (as when Discord's
			// buffer is), and it starts anew.
			c.closeWith(4009, "fell behind the shard's dispatch retention", true)
			return
		}
		if len(p) == 0 {
			if resumed {
				resumed = false
				if !c.write([]byte(`{"op":0,"s":null,"t":"RESUMED","d":{}}`)) {
					return
				}
			}
			select {
			case <-ch:
			case <-c.closed:
				return
			case <-c.s.done:
				return
			}
			continue
		}
		off := rd.off - int64(len(p))
		ok := true
		c.bc.hold()
		eachLine(p, func(line []byte) {
			if !ok {
				return
			}
			off += int64(len(line))
			lines++
			e, parsed := parseLine(line)
			if !parsed || e.seq < 0 {
				return // RESUMED and the like are the node's
			}
			t := names.of(e.t)
			if t == "READY" {
				return // the client has its own
			}
			d, mine := c.route(t, e.d)
			if !mine || !covers(sess.intents, t, d) {
				return
			}
			if sess.withoutContent() && (t == "MESSAGE_CREATE" || t == "MESSAGE_UPDATE") {
				d = withoutContent(d, sess.userID)
			}
			sess.mu.Lock()
			sess.cursor = mark{off, lines}
			seq := sess.next()
			sess.events++
			sess.mu.Unlock()
			frame = dispatchFrame(frame[:0], seq, t, d)
			ok = c.write(frame)
		})
		if c.bc.release() != nil {
			ok = false
		}
		sess.mu.Lock()
		sess.cursor = mark{off, lines}
		sess.mu.Unlock()
		if !ok {
			return
		}
	}
}

// route decides whether a dispatch that belongs to one client is this
// one's, and gives its d as the client should see it.
func (c *conn) route(t string, d []byte) ([]byte, bool) {
	s, sess := c.s, c.sess
	switch t {
	case "GUILD_MEMBERS_CHUNK":
		raw, _ := wire.Member(d, "nonce")
		nonce, _ := wire.String(raw)
		s.mu.Lock()
		owner, ok := s.nonces[nonce]
		s.mu.Unlock()
		if !ok || owner.sess != sess {
			return nil, false
		}
		var f map[string]json.RawMessage
		if json.Unmarshal(d, &f) != nil {
			return nil, false
		}
		if owner.nonce == nil {
			delete(f, "nonce")
		} else {
			f["nonce"] = owner.nonce
		}
		return mustMarshal(f), true
	case "VOICE_STATE_UPDATE", "VOICE_SERVER_UPDATE":
		if t == "VOICE_STATE_UPDATE" {
			raw, _ := wire.Member(d, "user_id")
			if u, _ := wire.String(raw); u != sess.userID || u == "" {
				return d, true
			}
		}
		raw, _ := wire.Member(d, "guild_id")
		g, _ := wire.String(raw)
		s.mu.Lock()
		owner := s.voice[g]
		s.mu.Unlock()
		return d, owner == nil || owner == sess
	}
	return d, true
}

// typeNames keeps one string per dispatch type, so that reading a type
// from a line allocates once per type, not once per line.
type typeNames map[string]string

func (n typeNames) of(b []byte) string {
	if t, ok := n[string(b)]; ok {
		return t
	}
	t := string(b)
	if len(n) < 1024 { // types are a fixed set; a bound all the same
		n[t] = t
	}
	return t
}
