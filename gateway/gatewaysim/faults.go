package gatewaysim

import (
	"fmt"
	"strings"
	"time"
)

// FaultKind is one kind of misbehaviour the simulator can inject.
type FaultKind int

const (
	// FaultClose closes with Fault.Code (default 4000) and Fault.Reason.
	// One-shot. Codes 4007 and 4009 end the session; others keep it
	// resumable.
	FaultClose FaultKind = iota + 1
	// FaultCloseNoStatus sends a close frame without a status code (the
	// client sees 1005). One-shot; the session stays resumable.
	FaultCloseNoStatus
	// FaultDrop resets the TCP connection without a close frame. One-shot;
	// the session stays resumable.
	FaultDrop
	// FaultInvalidSession sends op 9 with d = Fault.Resumable. One-shot. The
	// connection stays open and unauthenticated; the session stays
	// resumable with d true and ends with d false.
	FaultInvalidSession
	// FaultReconnect sends op 7; the connection is closed 4000 if still
	// open after Config.ReconnectGrace. One-shot.
	FaultReconnect
	// FaultHeartbeatRequest sends op 1; the client must heartbeat at once.
	// One-shot.
	FaultHeartbeatRequest
	// FaultGarbage sends a binary frame of bytes that are neither JSON nor
	// any compressed stream. One-shot.
	FaultGarbage
	// FaultInvalidJSON sends a truncated JSON payload, compressed like any
	// other. One-shot.
	FaultInvalidJSON
	// FaultCorruptCompression sends bytes that break the connection's
	// zlib or zstd context (garbage on an uncompressed connection).
	// One-shot.
	FaultCorruptCompression
	// FaultOversized sends a valid dispatch of Fault.Size bytes (default
	// 11 MiB, over a client's 10 MiB decompressed limit) with a null
	// sequence. One-shot.
	FaultOversized
	// FaultSecondHello sends another Hello. One-shot.
	FaultSecondHello
	// FaultBackwardsSequence sends a MESSAGE_CREATE whose sequence is one
	// below the last one sent; it is not retained. One-shot.
	FaultBackwardsSequence
	// FaultUnknownOpcode sends a payload with opcode 42. One-shot.
	FaultUnknownOpcode
	// FaultStopAcks stops heartbeat ACKs. Sticky until ClearFaults; it also
	// applies to later connections of the shard.
	FaultStopAcks
	// FaultDelay delays every frame by Fault.Delay; zero clears it. Sticky
	// until ClearFaults; it also applies to later connections of the shard.
	FaultDelay
	// FaultBinaryJSON sends a valid dispatch without a sequence in a
	// binary frame, uncompressed whatever was negotiated. One-shot.
	FaultBinaryJSON
)

var faultNames = map[FaultKind]string{
	FaultClose:              "close",
	FaultCloseNoStatus:      "close-no-status",
	FaultDrop:               "drop",
	FaultInvalidSession:     "invalid-session",
	FaultReconnect:          "reconnect",
	FaultHeartbeatRequest:   "heartbeat-request",
	FaultGarbage:            "garbage",
	FaultInvalidJSON:        "invalid-json",
	FaultCorruptCompression: "corrupt-compression",
	FaultOversized:          "oversized",
	FaultSecondHello:        "second-hello",
	FaultBackwardsSequence:  "backwards-sequence",
	FaultUnknownOpcode:      "unknown-opcode",
	FaultStopAcks:           "stop-acks",
	FaultDelay:              "delay",
	FaultBinaryJSON:         "binary-json",
}

func (k FaultKind) String() string {
	if n, ok := faultNames[k]; ok {
		return n
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// FaultKinds lists every fault kind, for chaos loops.
func FaultKinds() []FaultKind {
	kinds := make([]FaultKind, 0, len(faultNames))
	for k := FaultClose; k <= FaultDelay; k++ {
		kinds = append(kinds, k)
	}
	return kinds
}

// ParseFaultKind returns the kind a String result names.
func ParseFaultKind(name string) (FaultKind, error) {
	for k, n := range faultNames {
		if strings.EqualFold(n, name) {
			return k, nil
		}
	}
	return 0, fmt.Errorf("gatewaysim: unknown fault %q", name)
}

// Fault is a misbehaviour to inject, with the parameters its kind uses.
type Fault struct {
	Kind      FaultKind
	Code      int           // FaultClose
	Reason    string        // FaultClose
	Resumable bool          // FaultInvalidSession
	Size      int           // FaultOversized
	Delay     time.Duration // FaultDelay
}

func (f Fault) String() string {
	switch f.Kind {
	case FaultClose:
		return fmt.Sprintf("close %d", f.code())
	case FaultInvalidSession:
		return fmt.Sprintf("invalid-session %t", f.Resumable)
	case FaultDelay:
		return fmt.Sprintf("delay %v", f.Delay)
	case FaultOversized:
		return fmt.Sprintf("oversized %d", f.size())
	}
	return f.Kind.String()
}

func (f Fault) code() int {
	if f.Code == 0 {
		return CloseUnknownError
	}
	return f.Code
}

func (f Fault) size() int {
	if f.Size <= 0 {
		return 11 << 20
	}
	return f.Size
}

// stickyFaults are the faults that outlive one injection.
type stickyFaults struct {
	noAcks bool
	delay  time.Duration
}

func (a stickyFaults) merge(b stickyFaults) stickyFaults {
	return stickyFaults{noAcks: a.noAcks || b.noAcks, delay: max(a.delay, b.delay)}
}

// Inject applies a fault to the connections of a shard id's sessions, or to
// every connection with AllShards, and returns how many connections it
// touched. Sticky faults also apply to the shard's later connections.
func (s *Server) Inject(shardID int, f Fault) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.changes.notify()
	targets := s.targetsLocked(shardID)
	switch f.Kind {
	case FaultStopAcks, FaultDelay:
		sticky := &s.allFaults
		if shardID != AllShards {
			sticky = &s.shardLocked(shardID).faults
		}
		if f.Kind == FaultStopAcks {
			sticky.noAcks = true
		} else {
			sticky.delay = max(f.Delay, 0)
		}
		for _, c := range targets {
			c.applyFaultsLocked()
		}
		return len(targets)
	}
	for _, c := range targets {
		s.injectLocked(c, f)
	}
	s.log.Debug("fault injected", "shard", shardID, "fault", f.String(), "connections", len(targets))
	return len(targets)
}

// ClearFaults removes the sticky faults of a shard id, or of every shard
// and the all-shards setting with AllShards.
func (s *Server) ClearFaults(shardID int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if shardID == AllShards {
		s.allFaults = stickyFaults{}
		for _, sh := range s.shards {
			sh.faults = stickyFaults{}
		}
	} else if sh := s.shards[shardID]; sh != nil {
		sh.faults = stickyFaults{}
	}
	for c := range s.conns {
		c.applyFaultsLocked()
	}
}

// targetsLocked lists the open connections a fault for shardID reaches.
func (s *Server) targetsLocked(shardID int) []*conn {
	var out []*conn
	if shardID == AllShards {
		for c := range s.conns {
			if !c.finished {
				out = append(out, c)
			}
		}
		return out
	}
	if sh := s.shards[shardID]; sh != nil {
		for _, sess := range sh.sessions {
			if c := sess.conn; c != nil && !c.finished {
				out = append(out, c)
			}
		}
	}
	return out
}

// corruptStream breaks a zlib or zstd context: in deflate the first byte
// starts a block of the reserved type 3, in zstd a block header of the
// reserved type 3. The tail keeps the zlib-stream message suffix so that a
// client feeds it to its inflater.
var corruptStream = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0xff, 0xff}

var binaryDispatch = []byte(`{"op":0,"s":null,"t":"MESSAGE_CREATE","d":{"content":"sent in a binary frame"}}`)

var garbage = []byte{0xde, 0xad, 0xbe, 0xef, 0x00, 0x13, 0x37, 0xc0, 0xff, 0xee, 0x7f, 0x80}

// injectLocked applies a one-shot fault to one connection. s.mu must be
// held.
func (s *Server) injectLocked(c *conn, f Fault) {
	switch f.Kind {
	case FaultClose:
		c.closeLocked(f.code(), f.Reason)
	case FaultCloseNoStatus:
		c.closeLocked(0, "")
	case FaultDrop:
		c.abortLocked()
	case FaultInvalidSession:
		if f.Resumable {
			c.enqueue(frame{kind: framePayload, data: invalidSessionTrue})
			if c.sess != nil {
				s.detachLocked(c.sess)
			}
		} else {
			c.enqueue(frame{kind: framePayload, data: invalidSessionNo})
			if c.sess != nil {
				s.endSessionLocked(c.sess)
			}
		}
	case FaultReconnect:
		s.reconnectLocked(c)
	case FaultHeartbeatRequest:
		c.enqueue(frame{kind: framePayload, data: heartbeatRequest})
	case FaultGarbage:
		c.enqueue(frame{kind: frameBinary, data: garbage})
	case FaultInvalidJSON:
		c.enqueue(frame{kind: framePayload, data: invalidJSONPayload})
	case FaultCorruptCompression:
		if c.out == compressNone {
			c.enqueue(frame{kind: frameBinary, data: garbage})
		} else {
			c.enqueue(frame{kind: frameBinary, data: corruptStream})
		}
	case FaultOversized:
		size := f.size()
		b := make([]byte, 0, size+64)
		b = append(b, `{"op":0,"s":null,"t":"GUILD_MEMBERS_CHUNK","d":{"padding":"`...)
		for len(b) < size-3 {
			b = append(b, 'a')
		}
		b = append(b, `"}}`...)
		c.enqueue(frame{kind: framePayload, data: b})
	case FaultSecondHello:
		c.enqueue(frame{kind: framePayload, data: s.helloPayload()})
	case FaultBackwardsSequence:
		var seq int64
		var g uint64
		if sess := c.sess; sess != nil {
			seq = max(sess.seq-1, 0)
			if s.guildCount(sess.sh.id, sess.total) > 0 {
				g = GuildID(firstGuild(sess.sh.id, sess.total))
			}
		}
		c.enqueue(frame{kind: frameDispatch, seq: seq, name: "MESSAGE_CREATE", data: s.messageData(g, 200)})
	case FaultUnknownOpcode:
		c.enqueue(frame{kind: framePayload, data: unknownOpPayload})
	case FaultBinaryJSON:
		c.enqueue(frame{kind: frameBinary, data: binaryDispatch})
	}
}

// Drain sends op 7 Reconnect to every connection, as a gateway node does
// before it restarts, and returns how many it told. Connections still open
// after Config.ReconnectGrace are closed 4000; their sessions stay
// resumable.
func (s *Server) Drain() int {
	return s.Inject(AllShards, Fault{Kind: FaultReconnect})
}

// reconnectLocked sends op 7 and arranges the forced close. s.mu must be
// held.
func (s *Server) reconnectLocked(c *conn) {
	if c.closing || c.finished {
		return
	}
	c.enqueue(frame{kind: framePayload, data: reconnectPayload})
	if c.reconnectBy.IsZero() {
		c.reconnectBy = s.clock.Now().Add(s.cfg.ReconnectGrace)
	}
	if s.sweepTimer == nil {
		s.sweepTimer = s.after(s.cfg.ReconnectGrace, s.sweepReconnects)
	}
}

// sweepReconnects closes the connections told to reconnect whose grace has
// run out, and waits for the next one.
func (s *Server) sweepReconnects() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var next time.Time
	for c := range s.conns {
		if c.reconnectBy.IsZero() || c.closing || c.finished {
			continue
		}
		if !now.Before(c.reconnectBy) {
			c.closeLocked(CloseUnknownError, "Reconnect requested.")
			continue
		}
		if next.IsZero() || c.reconnectBy.Before(next) {
			next = c.reconnectBy
		}
	}
	if next.IsZero() {
		s.sweepTimer = nil
		return
	}
	s.sweepTimer.Reset(next.Sub(now))
}
