package gatewaysim

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	"github.com/shardfs/shardfs/clock"
)

// compression is a transport compression of one direction of a connection.
type compression int

const (
	compressNone compression = iota
	compressZlib             // Discord zlib-stream: one deflate context, sync flush per message
	compressZstd             // zstd-stream: one zstd frame per connection, a flushed block per message
)

const (
	// writeTimeout bounds one frame write to a client that stopped reading.
	writeTimeout = 10 * time.Second
	// closeGrace is how long the server waits for the client's close frame
	// after sending its own. It is network time, so it uses the real clock.
	closeGrace = 2 * time.Second
)

type frameKind uint8

const (
	frameDispatch frameKind = iota // op 0 built at write time from seq, name and data
	framePayload                   // a JSON payload, compressed like any other
	frameBinary                    // raw bytes that bypass compression (corrupt frames)
	frameClose                     // a close frame; code 0 sends one without status
)

// frame is one message waiting for a connection's writer.
type frame struct {
	kind   frameKind
	seq    int64 // frameDispatch; negative is sent as null
	name   string
	data   []byte
	sess   *session // frameDispatch of a session, for its counters
	code   int
	reason string
	due    time.Time // zero means now; set while a delay fault is active
}

// conn is one gateway WebSocket connection. Its reader runs in the HTTP
// handler's goroutine; a writer goroutine runs only while frames are due.
type conn struct {
	s         *Server
	ws        *websocket.Conn
	id        uint64 // from 1 in accept order, for Frame
	remote    string // the client's address, for Frame
	viaResume bool
	version   int // gateway version the client asked for (Discord 9 or 10; Fluxer 1)
	out, in   compression

	// Guarded by s.mu.
	sess        *session
	closing     bool // the server sent or queued its close
	closeCode   int
	finished    bool
	hb          clock.Timer
	hbDue       time.Time
	hbRequested bool
	noAcks      bool
	reconnectBy time.Time   // op 7 sent; closed 4000 if still open then
	heardAt     time.Time   // the client's last frame (Config.QuietAfter)
	quiet       bool        // the session is out of LiveSessions, see quiet.go
	quietT      clock.Timer // nil unless Config.QuietAfter

	// Owned by the reader goroutine.
	sends []int64 // clock times of recent commands, for the send budget

	// Guarded by wmu, which is taken after s.mu when both are needed.
	wmu       sync.Mutex
	queue     []frame
	spare     []frame
	writing   bool // a writer goroutine is running
	dead      bool // nothing more will be written
	wake      clock.Timer
	delay     time.Duration
	flood     int
	floodData []byte

	// Owned by whichever writer goroutine is running.
	sink sinkWriter
	zw   *zlib.Writer
	zs   *zstd.Encoder
}

func newConn(s *Server, ws *websocket.Conn, viaResume bool) *conn {
	return &conn{s: s, ws: ws, viaResume: viaResume, id: s.connSeq.Add(1), remote: ws.RemoteAddr().String()}
}

// negotiate applies the query of the upgrade request. A non-zero code is the
// close code the connection must get before Hello.
func (c *conn) negotiate(v, encoding, compress, stream string) (int, string) {
	if c.s.cfg.Flavor == Fluxer {
		if v != "1" {
			return CloseInvalidAPIVersion, "Invalid API version"
		}
		c.version = 1
		if compress == "zstd-stream" {
			c.out = compressZstd
			if stream == "1" {
				c.in = compressZstd
			}
		}
		return 0, ""
	}
	// The versions Discord's API reference lists as Available; both get
	// the v10 protocol, and READY reports the one asked for.
	switch v {
	case "9":
		c.version = 9
	case "10":
		c.version = 10
	default:
		return CloseInvalidAPIVersion, "Invalid API version."
	}
	if encoding != "" && encoding != "json" {
		return CloseDecodeError, "Unsupported encoding."
	}
	switch compress {
	case "zlib-stream":
		c.out = compressZlib
	case "zstd-stream":
		c.out = compressZstd
	}
	return 0, ""
}

// hello sends Hello and starts the heartbeat deadline.
func (c *conn) hello() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c.applyFaultsLocked()
	c.armHeartbeatLocked()
	c.enqueue(frame{kind: framePayload, data: s.helloPayload()})
}

func (s *Server) helloPayload() []byte {
	return fmt.Appendf(nil, helloTemplate, s.cfg.HeartbeatInterval.Milliseconds())
}

// serve reads the connection until it ends, then settles its session.
func (c *conn) serve() {
	err := readPayloads(wsSource{c}, c.in == compressZstd, c.handle)
	switch {
	case errors.Is(err, errTooLarge):
		c.close(CloseDecodeError, "Payload too large")
		err = c.drain()
	case errors.Is(err, errDecompress):
		c.close(CloseDecodeError, "Decompression failed")
		err = c.drain()
	case errors.Is(err, errStop):
		err = c.drain()
	}
	clientCode := 0
	var ce *websocket.CloseError
	// 1006 is what gorilla reports for a connection that ended without a
	// close frame (RFC 6455 7.4.1: never sent on the wire): no frame of
	// the client's, so OnFrame does not hear of it (the soak counted a
	// woken node's dropped socket as a frame for a shard it had lost).
	closed := errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure
	if closed {
		clientCode = ce.Code
	}
	s := c.s
	s.mu.Lock()
	rec := Frame{Conn: c.id, Remote: c.remote, Op: OpClose, Code: clientCode, Reply: c.closing, Shard: c.shardLocked(), At: s.clock.Now()}
	if c.sess != nil {
		rec.Total = c.sess.total
	}
	s.finishLocked(c, clientCode)
	s.mu.Unlock()
	if closed && s.cfg.OnFrame != nil {
		s.cfg.OnFrame(rec)
	}
	c.shutdown()
}

// drain discards messages until the peer's close frame or an error.
func (c *conn) drain() error {
	for {
		_, r, err := c.ws.NextReader()
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, r); err != nil {
			return err
		}
	}
}

// finishLocked settles a connection whose reader ended: a session closed by
// the client with 1000 or 1001 ends; any other ending keeps it resumable.
// s.mu must be held.
func (s *Server) finishLocked(c *conn, clientCode int) {
	if c.finished {
		return
	}
	c.finished = true
	if c.hb != nil {
		c.hb.Stop()
	}
	if c.quietT != nil {
		c.quietT.Stop()
	}
	delete(s.conns, c)
	shardID := -1
	if sess := c.sess; sess != nil {
		shardID = sess.sh.id
		if !c.closing && (clientCode == CloseNormal || clientCode == CloseGoingAway) {
			s.endSessionLocked(sess)
		} else {
			s.detachLocked(sess)
		}
	}
	s.log.Debug("gateway connection ended", "shard", shardID, "server_code", c.closeCode, "client_code", clientCode)
	s.changes.notify()
}

// shutdown stops the writer and closes the socket.
func (c *conn) shutdown() {
	c.wmu.Lock()
	c.dead = true
	c.queue = nil
	if c.wake != nil {
		c.wake.Stop()
	}
	c.wmu.Unlock()
	_ = c.ws.NetConn().Close()
}

// goingAway tells the client the server is shutting down.
func (c *conn) goingAway(deadline time.Time) {
	_ = c.ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(CloseGoingAway, "simulator shutting down"), deadline)
}

// abortLocked drops the TCP connection without a close frame, as a network
// failure would.
func (c *conn) abortLocked() {
	c.wmu.Lock()
	c.dead = true
	c.queue = nil
	c.wmu.Unlock()
	if tc, ok := c.ws.NetConn().(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // a reset, not an orderly FIN
	}
	_ = c.ws.NetConn().Close()
}

// close is closeLocked for callers that do not hold s.mu.
func (c *conn) close(code int, reason string) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.closeLocked(code, reason)
}

// closeLocked queues a close frame. Closes that tell the client to start a
// new session end the session at once. s.mu must be held.
func (c *conn) closeLocked(code int, reason string) {
	if c.closing || c.finished {
		return
	}
	c.closing = true
	c.closeCode = code
	if sess := c.sess; sess != nil && endsSession(code) {
		c.s.endSessionLocked(sess)
	}
	c.enqueue(frame{kind: frameClose, code: code, reason: reason})
	c.s.changes.notify()
}

// endsSession reports whether a server close code leaves nothing to resume.
func endsSession(code int) bool {
	switch code {
	case CloseInvalidSeq, CloseSessionTimedOut, CloseAuthenticationFailed,
		CloseInvalidShard, CloseShardingRequired, CloseInvalidAPIVersion,
		CloseInvalidIntents, CloseDisallowedIntents:
		return true
	}
	return false
}

// applyFaultsLocked copies the sticky faults of the connection's shard and
// of all shards onto it. s.mu must be held.
func (c *conn) applyFaultsLocked() {
	f := c.s.allFaults
	if c.sess != nil {
		f = f.merge(c.sess.sh.faults)
	}
	c.noAcks = f.noAcks
	c.wmu.Lock()
	c.delay = f.delay
	c.wmu.Unlock()
}

// armHeartbeatLocked restarts the heartbeat deadline. s.mu must be held.
func (c *conn) armHeartbeatLocked() {
	s := c.s
	c.hbRequested = false
	wait := s.cfg.HeartbeatTimeout
	if s.cfg.HeartbeatRequestAfter > 0 {
		wait = s.cfg.HeartbeatRequestAfter
	}
	c.hbDue = s.clock.Now().Add(wait)
	if c.hb == nil {
		c.hb = s.after(wait, c.heartbeatDue)
	} else {
		c.hb.Reset(wait)
	}
}

// heartbeatDue asks for a heartbeat (Fluxer) or closes a connection whose
// client stopped heartbeating.
func (c *conn) heartbeatDue() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.finished || c.closing {
		return
	}
	now := s.clock.Now()
	if left := c.hbDue.Sub(now); left > 0 {
		// A heartbeat moved the deadline after this call was already due.
		c.hb.Reset(left)
		return
	}
	if s.cfg.HeartbeatRequestAfter > 0 && !c.hbRequested {
		c.hbRequested = true
		c.enqueue(frame{kind: framePayload, data: heartbeatRequest})
		rest := s.cfg.HeartbeatTimeout - s.cfg.HeartbeatRequestAfter
		c.hbDue = now.Add(rest)
		c.hb.Reset(rest)
		return
	}
	reason := "Session timed out."
	if s.cfg.Flavor == Fluxer {
		reason = "Heartbeat timeout"
	}
	c.closeLocked(CloseSessionTimedOut, reason)
}

// spend charges one command to the connection's send budget and reports
// whether the budget allowed it.
func (c *conn) spend(now time.Time) bool {
	cfg := c.s.cfg
	t := now.UnixNano()
	cutoff := t - int64(cfg.SendWindow)
	i := 0
	for i < len(c.sends) && c.sends[i] <= cutoff {
		i++
	}
	if i > 0 {
		n := copy(c.sends, c.sends[i:])
		c.sends = c.sends[:n]
	}
	if len(c.sends) >= cfg.SendLimit {
		return false
	}
	c.sends = append(c.sends, t)
	return true
}

// enqueue queues a frame for the writer. Callers may hold s.mu.
func (c *conn) enqueue(f frame) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.dead {
		return
	}
	if len(c.queue) >= c.s.cfg.MaxQueuedFrames {
		// The client stopped reading; drop it as a real gateway would
		// rather than buffer without bound. Its session stays resumable.
		c.s.log.Warn("gateway connection dropped: client too slow", "queued", len(c.queue))
		c.dead = true
		c.queue = nil
		_ = c.ws.NetConn().Close()
		return
	}
	if c.delay > 0 && f.due.IsZero() {
		f.due = c.s.clock.Now().Add(c.delay)
	}
	c.queue = append(c.queue, f)
	c.kickLocked()
}

// kickLocked starts the writer when a frame is due, or arms a wake-up for a
// delayed one. c.wmu must be held.
func (c *conn) kickLocked() {
	if c.writing || c.dead {
		return
	}
	if len(c.queue) > 0 && !c.queue[0].due.IsZero() {
		if wait := c.queue[0].due.Sub(c.s.clock.Now()); wait > 0 {
			c.wakeAfterLocked(wait)
			return
		}
	}
	if len(c.queue) == 0 && c.flood == 0 {
		return
	}
	c.writing = true
	if !c.s.spawn(c.writeLoop) {
		c.writing = false
	}
}

func (c *conn) wakeAfterLocked(d time.Duration) {
	if c.wake == nil {
		c.wake = c.s.after(d, c.wakeUp)
	} else {
		c.wake.Reset(d)
	}
}

func (c *conn) wakeUp() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.kickLocked()
}

var scratchPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 2048)
	return &b
}}

// writeLoop writes due frames until none is left.
func (c *conn) writeLoop() {
	bp := scratchPool.Get().(*[]byte)
	defer scratchPool.Put(bp)
	wrote := false
	defer func() {
		if wrote {
			c.s.changes.notify()
		}
	}()
	for {
		batch, ok := c.takeBatch()
		if !ok {
			return
		}
		for i := range batch {
			err := c.write(&batch[i], bp)
			if errors.Is(err, errCloseSent) {
				return
			}
			if err != nil {
				c.wmu.Lock()
				c.dead = true
				c.queue = nil
				c.writing = false
				c.wmu.Unlock()
				_ = c.ws.NetConn().Close()
				return
			}
			wrote = true
		}
		clear(batch)
		c.wmu.Lock()
		if c.spare == nil && cap(batch) <= 4096 {
			c.spare = batch[:0]
		}
		c.wmu.Unlock()
	}
}

var errCloseSent = errors.New("close frame sent")

// takeBatch removes the frames that are due. With none due it generates a
// flood batch, or clears writing and reports false.
func (c *conn) takeBatch() ([]frame, bool) {
	for {
		c.wmu.Lock()
		if c.dead {
			c.writing = false
			c.wmu.Unlock()
			return nil, false
		}
		k := 0
		if len(c.queue) > 0 {
			var now time.Time
			if c.delay > 0 || !c.queue[0].due.IsZero() {
				now = c.s.clock.Now()
			}
			for k < len(c.queue) && (c.queue[k].due.IsZero() || !c.queue[k].due.After(now)) {
				k++
			}
		}
		if k > 0 {
			var batch []frame
			if k == len(c.queue) {
				batch, c.queue, c.spare = c.queue, c.spare, nil
				c.queue = c.queue[:0]
			} else {
				batch = append(c.spare[:0], c.queue[:k]...)
				c.spare = nil
				n := copy(c.queue, c.queue[k:])
				clear(c.queue[n:])
				c.queue = c.queue[:n]
			}
			c.wmu.Unlock()
			return batch, true
		}
		if len(c.queue) == 0 && c.flood > 0 {
			c.wmu.Unlock()
			c.s.floodBatch(c)
			continue
		}
		if len(c.queue) > 0 {
			c.wakeAfterLocked(c.queue[0].due.Sub(c.s.clock.Now()))
		}
		c.writing = false
		c.wmu.Unlock()
		return nil, false
	}
}

// write sends one frame.
func (c *conn) write(f *frame, scratch *[]byte) error {
	_ = c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	switch f.kind {
	case frameDispatch:
		*scratch = appendDispatch((*scratch)[:0], f.seq, f.name, f.data)
		if err := c.writePayload(*scratch); err != nil {
			return err
		}
		if sess := f.sess; sess != nil {
			sess.sh.dispatched.Add(1)
			for {
				old := sess.sent.Load()
				if f.seq <= old || sess.sent.CompareAndSwap(old, f.seq) {
					break
				}
			}
		}
		return nil
	case framePayload:
		return c.writePayload(f.data)
	case frameBinary:
		return c.ws.WriteMessage(websocket.BinaryMessage, f.data)
	case frameClose:
		msg := []byte{}
		if f.code != 0 {
			msg = websocket.FormatCloseMessage(f.code, f.reason)
		}
		err := c.ws.WriteMessage(websocket.CloseMessage, msg)
		c.wmu.Lock()
		c.dead = true
		c.queue = nil
		c.writing = false
		c.wmu.Unlock()
		_ = c.ws.SetReadDeadline(time.Now().Add(closeGrace))
		if err != nil {
			_ = c.ws.NetConn().Close()
		}
		return errCloseSent
	}
	return nil
}

// sinkWriter lets a compressor that lives as long as the connection write
// into each message's writer in turn.
type sinkWriter struct{ w io.Writer }

func (s *sinkWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

// writePayload writes one gateway payload, compressed as negotiated.
func (c *conn) writePayload(p []byte) error {
	if c.out == compressNone {
		return c.ws.WriteMessage(websocket.TextMessage, p)
	}
	w, err := c.ws.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	c.sink.w = w
	defer func() { c.sink.w = nil }()
	switch c.out {
	case compressZlib:
		if c.zw == nil {
			c.zw, err = zlib.NewWriterLevel(&c.sink, zlib.BestSpeed)
			if err != nil {
				return err
			}
		}
		if _, err := c.zw.Write(p); err != nil {
			return err
		}
		// A sync flush ends the message with 00 00 ff ff.
		if err := c.zw.Flush(); err != nil {
			return err
		}
	case compressZstd:
		if c.zs == nil {
			c.zs, err = zstd.NewWriter(&c.sink,
				zstd.WithEncoderConcurrency(1),
				zstd.WithEncoderLevel(zstd.SpeedFastest),
				zstd.WithWindowSize(1<<17),
				zstd.WithLowerEncoderMem(true),
			)
			if err != nil {
				return err
			}
		}
		if _, err := c.zs.Write(p); err != nil {
			return err
		}
		// Flush ends the block, not the frame: the frame lasts as long as
		// the connection.
		if err := c.zs.Flush(); err != nil {
			return err
		}
	}
	return w.Close()
}
