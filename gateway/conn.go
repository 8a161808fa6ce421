package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/wire"
)

// Network deadlines, in real time: they bound what the peer's kernel does,
// not what the protocol says.
const (
	writeTimeout = 10 * time.Second
	// closeGrace is how long a client close waits for the gateway to
	// answer its close frame before dropping the socket.
	closeGrace = 2 * time.Second
	// maxQueued bounds commands waiting for the socket; the core's send
	// budget keeps far fewer in flight.
	maxQueued = 64
)

var aLongTimeAgo = time.Unix(1, 0)

var errNotOpen = fmt.Errorf("%w: the gateway connection is not open", core.ErrBusy)

// conn is one connection attempt: one reader goroutine, one clock timer,
// and, only while commands wait for the socket, one writer goroutine.
type conn struct {
	t        *Transport
	link     *core.Link
	a        core.Attempt
	rec      *shardRecord
	slotBack atomic.Bool // the identify slot was given back (identifyLate)

	// ended closes once the connection can write nothing more (see Ended).
	ended     chan struct{}
	endedOnce sync.Once

	// Owned by the reader goroutine.
	inf  *inflater
	sid  string // session id this connection serves, "" before READY
	skey string // core.SessionKey(sid), for the sink
	base string // URL connected to, without query
	idle *idleConn
	// messages counts messages read whole from gorilla (not through inf):
	// for idle.t.quiet, and the first one says whether the gateway
	// compresses.
	messages int64
	// lazy and quietSince decide where the reader waits (see wait): not
	// phases, since a connection parks in whatever phase it is in (while
	// the gate holds its identify, say).
	lazy bool // the last wait for a byte was long: park at the next
	// quietSince is when the reader last had nothing left to read (the
	// upgrade, or the end of a message that left the socket quiet): a wait
	// for a byte, in place or parked, counts from there.
	quietSince time.Time

	seq atomic.Int64  // last sequence handed to the sink; -1 for none
	ph  atomic.Uint32 // the phase; written only by setPhaseLocked

	mu        sync.Mutex
	closeCode int                // set with phaseClosing: the code the client closes with
	cancel    context.CancelFunc // while dialling
	raw       net.Conn           // while the upgrade is in progress
	ws        *websocket.Conn
	cs        core.ConnState
	timer     clock.Timer
	interval  time.Duration
	hbNext    time.Time // next heartbeat; zero before Hello
	waitUntil time.Time // Hello or READY/RESUMED deadline; zero when not waiting
	waitWhat  string
	// awaiting is heartbeat state, and writing says whether a writer
	// goroutine exists: both change many times in one phase.
	awaiting bool      // a heartbeat is not acknowledged yet
	unacked  time.Time // when the oldest unacknowledged heartbeat went out
	sentAt   time.Time // when the latest heartbeat went out
	sendQ    [][]byte
	writing  bool // a writer goroutine drains sendQ
	// An identify waiting for its bucket's window (identifyGate): the
	// payload, and the ticket that says when it may go out.
	pendingID []byte
	ticket    *gateTicket

	wmu  sync.Mutex // serialises writes; guards zout and zhdr
	zout bool       // client payloads go through the zstd stream (Fluxer stream=1)
	zhdr bool       // its frame header was sent
}

var _ core.Conn = (*conn)(nil)

// shardRecord remembers, per shard, what the sink has seen of the current
// session. A connection the core has already replaced may still be
// delivering the event it was reading (the core closes connections
// without waiting for them); the record lets the replay on the new
// connection skip exactly the events the sink already has, so a resume
// never duplicates one, and stops a connection of an older session from
// delivering after a newer READY.
type shardRecord struct {
	mu      sync.Mutex
	session string
	last    int64
}

func (t *Transport) record(shard int) *shardRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.records == nil {
		t.records = make(map[int]*shardRecord)
	}
	r := t.records[shard]
	if r == nil {
		r = &shardRecord{last: -1}
		t.records[shard] = r
	}
	return r
}

// phase returns the connection's phase; it may change as soon as it is
// read, except under mu.
func (c *conn) phase() phase { return phase(c.ph.Load()) }

// setPhaseLocked moves the connection from phase from to phase to, and
// reports whether it was in from (another goroutine may have moved it
// first: Close, report and the reader race). A move phaseMoves does not
// list is a bug in the caller, whatever the timing, and panics.
func (c *conn) setPhaseLocked(from, to phase) bool {
	if !phaseMoves[from].Has(to) {
		panic(fmt.Sprintf("gateway: connection phase %v cannot move to %v", from, to))
	}
	if c.phase() != from {
		return false
	}
	c.ph.Store(uint32(to))
	if c.t.onPhase != nil {
		c.t.onPhase(c, from, to)
	}
	return true
}

func newConn(t *Transport, l *core.Link, a core.Attempt) *conn {
	c := &conn{t: t, link: l, a: a, rec: t.record(a.Shard), ended: make(chan struct{})}
	c.seq.Store(-1)
	if a.Resume {
		c.seq.Store(a.Sequence)
		c.sid = a.Session.ID
		c.skey = core.SessionKey(c.sid)
	}
	return c
}

// run is the connection's reader goroutine.
func (c *conn) run() {
	parked := false
	defer func() {
		if !parked {
			c.finish()
		}
	}()
	defer c.link.Recover()
	ws, err := c.dialSlot()
	if err != nil {
		if !c.phase().closing() {
			c.report(c.classify(err))
		}
		return
	}
	parked = c.serve(ws)
}

// dialSlot dials in the slot Transport.start gave the connection, and
// gives it back (see maxDialing).
func (c *conn) dialSlot() (*websocket.Conn, error) {
	defer c.t.dialDone()
	return c.dial()
}

// parkAfter is how long a connection must have waited for its last byte
// before it is parked at the next wait: connections that receive events
// often keep their reader, idle ones (a heartbeat ACK every 41 s) give it
// up.
const parkAfter = time.Second

// serve reads ws, one message at a time, until the connection ends, and
// ends it. Between messages the reader waits for the socket (wait), or,
// when the connection has fallen idle, parks it (see idler): serve returns
// true, its goroutine ends, and the idler starts a new reader (resume)
// when a byte arrives or Close wants the close frame sent. An idle shard
// then costs no goroutine and no stack.
func (c *conn) serve(ws *websocket.Conn) (parked bool) {
	for {
		if c.wait() {
			if c.t.idler.park(c) {
				return true
			}
			c.lazy = false // the transport is closing: wait in place
			continue
		}
		if err := c.readOne(ws); err != nil {
			c.end(ws, err)
			return false
		}
	}
}

// resume is a parked connection's new reader goroutine. The wait group
// count it gives back is the one the connection took when it parked.
func (c *conn) resume() {
	defer c.t.life.leave()
	parked := false
	defer func() {
		if !parked {
			c.finish()
		}
	}()
	defer c.link.Recover()
	// The byte that woke the connection is read first; whether it parks at
	// the following wait depends on how long it was quiet.
	c.lazy = false
	c.mu.Lock()
	ws := c.ws
	c.mu.Unlock()
	parked = c.serve(ws)
}

// endLocked moves the connection to phaseEnded, from wherever it is.
func (c *conn) endLocked() {
	if p := c.phase(); p != phaseEnded {
		c.setPhaseLocked(p, phaseEnded)
	}
}

// finish releases everything the connection holds.
func (c *conn) finish() {
	c.mu.Lock()
	c.endLocked()
	if c.timer != nil {
		c.timer.Stop()
	}
	ws, raw := c.ws, c.raw
	c.sendQ = nil
	if c.pendingID != nil {
		c.pendingID = nil
		c.t.gate.release(*c.ticket)
	}
	c.mu.Unlock()
	if ws != nil {
		_ = ws.NetConn().Close()
	}
	if raw != nil {
		_ = raw.Close()
	}
	if c.inf != nil {
		c.inf.close()
	}
	c.t.untrack(c)
	c.markEnded()
}

// Ended implements core.Ender: the channel closes once the connection's
// socket is closed, or when it never opened.
func (c *conn) Ended() <-chan struct{} { return c.ended }

func (c *conn) markEnded() { c.endedOnce.Do(func() { close(c.ended) }) }

// Abort implements core.Aborter: the socket closes now, without the close
// handshake (Handover calls it, after fencing the connection, when the
// handshake outlasted core.HandoverWait). The reader then fails and
// finishes, which closes Ended.
func (c *conn) Abort() {
	c.mu.Lock()
	cancel, raw, ws := c.cancel, c.raw, c.ws
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if raw != nil {
		_ = raw.Close()
	}
	if ws != nil {
		_ = ws.NetConn().Close()
		if c.idle != nil {
			// A parked connection has no reader to see the close: the
			// idler starts one, whose read fails and finishes it.
			c.t.idler.wake(c)
		}
	}
}

// Close implements core.Conn: it records the code and wakes the reader,
// which sends the close frame and waits for the gateway's answer. It never
// blocks and never calls the Link.
func (c *conn) Close(code int) {
	c.mu.Lock()
	p := c.phase()
	if p.closing() {
		c.mu.Unlock()
		return
	}
	if code == 0 {
		code = 4000
	}
	c.setPhaseLocked(p, phaseClosing)
	c.closeCode = code
	if c.timer != nil {
		c.timer.Stop()
	}
	cancel, raw, ws := c.cancel, c.raw, c.ws
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if raw != nil {
		_ = raw.Close() // no WebSocket yet, so no session to keep
	}
	if ws != nil {
		_ = ws.NetConn().SetReadDeadline(aLongTimeAgo)
		if c.idle != nil {
			c.t.idler.wake(c)
		}
	}
}

// Send implements core.Conn. The write happens in a writer goroutine, so
// that a socket the peer stopped reading cannot block the core.
func (c *conn) Send(p []byte) error {
	if len(p) > core.MaxPayload {
		return fmt.Errorf("%w: %d bytes; the gateway takes at most %d", core.ErrTooLarge, len(p), core.MaxPayload)
	}
	c.mu.Lock()
	open := c.phase().open()
	full := len(c.sendQ) >= maxQueued
	c.mu.Unlock()
	if !open {
		return errNotOpen
	}
	if full {
		return fmt.Errorf("%w: %d commands wait for the socket", core.ErrBusy, maxQueued)
	}
	c.enqueue(bytes.Clone(p))
	return nil
}

// Identify implements core.Conn: after Fluxer's op 9 the session identifies
// again on the open socket, once the core's pacer allowed it.
func (c *conn) Identify() {
	p, err := c.identifyPayload()
	if err != nil {
		return
	}
	now := c.t.clock.Now()
	c.mu.Lock()
	if !c.setPhaseLocked(phaseInvalidated, phaseIdentifying) {
		c.mu.Unlock()
		return
	}
	c.waitUntil, c.waitWhat = now.Add(c.t.cfg.ReadyTimeout), "READY"
	c.armLocked(now)
	c.mu.Unlock()
	c.enqueue(p)
}

func (c *conn) enqueue(p []byte) {
	c.mu.Lock()
	c.sendQ = append(c.sendQ, p)
	start := !c.writing
	c.writing = true
	c.mu.Unlock()
	if start && !c.t.life.Go(c.drainQueue) {
		c.mu.Lock()
		c.writing = false
		c.mu.Unlock()
	}
}

func (c *conn) drainQueue() {
	defer c.link.Recover()
	for {
		c.mu.Lock()
		if len(c.sendQ) == 0 || !c.phase().open() {
			c.sendQ = nil
			c.writing = false
			c.mu.Unlock()
			return
		}
		p := c.sendQ[0]
		c.sendQ[0] = nil
		c.sendQ = c.sendQ[1:]
		ws := c.ws
		c.mu.Unlock()
		if err := c.write(ws, p); err != nil {
			c.writeFailed(err)
		}
	}
}

// dial discovers (unless resuming or configured), connects, and upgrades.
// A resume whose resume URL cannot be reached tries the gateway URL once:
// any gateway node accepts a resume, and Discord asks to fall back to the
// cached URL when reconnecting fails.
func (c *conn) dial() (*websocket.Conn, error) {
	// Not a child of a transport-wide context: Transport.Close closes each
	// connection, and a parent would keep a map entry per dial.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.mu.Lock()
	if c.phase().closing() {
		c.mu.Unlock()
		return nil, errClosing
	}
	c.cancel = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.cancel = nil
		c.mu.Unlock()
	}()

	resumeURL := ""
	if c.a.Resume {
		resumeURL = c.a.Session.ResumeURL
		if err := c.t.checkResume(ctx, resumeURL); err != nil {
			return nil, err
		}
	}
	var err error
	for try := 0; try < 2; try++ {
		base, discovered := resumeURL, false
		if try > 0 || base == "" {
			if base, err = c.t.gatewayURL(ctx); err != nil {
				if c.phase().closing() {
					return nil, errClosing
				}
				return nil, discoveryFailed(err)
			}
			discovered = c.t.cfg.GatewayURL == ""
			if try > 0 && base == resumeURL {
				break
			}
		}
		var ws *websocket.Conn
		if ws, err = c.dialURL(ctx, base); err == nil {
			c.base = base
			return ws, nil
		}
		if c.phase().closing() {
			return nil, errClosing
		}
		if discovered {
			c.t.forgetURL(base)
		}
		if base != resumeURL {
			break
		}
		c.mu.Lock()
		c.cs = core.ConnState{}
		c.mu.Unlock()
	}
	return nil, err
}

func (c *conn) dialURL(ctx context.Context, base string) (*websocket.Conn, error) {
	target, err := c.t.connectURL(base)
	if err != nil {
		return nil, transient(faultDiscovery, err)
	}
	d := websocket.Dialer{
		NetDialContext:    c.dialPlain,
		NetDialTLSContext: c.dialTLS,
		HandshakeTimeout:  c.t.cfg.HandshakeTimeout,
		ReadBufferSize:    readBufferSize,
		WriteBufferPool:   &c.t.pool,
	}
	ws, resp, err := d.DialContext(ctx, target, http.Header{"User-Agent": {userAgent}})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	c.mu.Lock()
	c.raw = nil
	c.mu.Unlock()
	if err != nil {
		var ce *connError
		if errors.As(err, &ce) {
			return nil, ce
		}
		if resp != nil {
			err = fmt.Errorf("websocket upgrade refused: %s", resp.Status)
		} else {
			err = fmt.Errorf("websocket upgrade: %w", err)
		}
		return nil, transient(faultUpgrade, err)
	}
	now := c.t.clock.Now()
	c.mu.Lock()
	if !c.setPhaseLocked(phaseDialing, phaseHello) {
		c.mu.Unlock()
		_ = ws.NetConn().Close()
		return nil, errClosing
	}
	c.ws = ws
	c.quietSince = now
	c.cs.WS = core.LayerOK
	cs := c.cs
	c.waitUntil, c.waitWhat = now.Add(c.t.cfg.HelloTimeout), "Hello"
	c.armLocked(now)
	c.mu.Unlock()
	c.t.log.Debug("gateway: connected", "shard", c.a.Shard, "host", ws.RemoteAddr().String())
	c.link.Transport(cs)
	c.link.Phase(core.PhaseHello)
	return ws, nil
}

// layers updates the connection's layer states and reports them.
func (c *conn) layers(f func(*core.ConnState)) {
	c.mu.Lock()
	f(&c.cs)
	cs := c.cs
	c.mu.Unlock()
	c.link.Transport(cs)
}

func (c *conn) dialTCP(ctx context.Context, network, addr string) (net.Conn, error) {
	c.layers(func(cs *core.ConnState) { cs.TCP = core.LayerConnecting })
	nc, err := c.t.dialer.DialContext(ctx, network, addr)
	if err != nil {
		c.layers(func(cs *core.ConnState) { cs.TCP = core.LayerFailed })
		return nil, transient(faultTCP, fmt.Errorf("tcp: %w", err))
	}
	c.mu.Lock()
	closing := c.phase().closing()
	if !closing {
		c.raw = nc
	}
	c.mu.Unlock()
	if closing {
		_ = nc.Close()
		return nil, errClosing
	}
	c.layers(func(cs *core.ConnState) { cs.TCP = core.LayerOK })
	return nc, nil
}

func (c *conn) dialPlain(ctx context.Context, network, addr string) (net.Conn, error) {
	nc, err := c.dialTCP(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.idle = nil // a connection that failed before this one may have set it
	if c.t.cfg.Compression == NoCompression {
		nc = newIdleConn(nc)
		c.idle, _ = nc.(*idleConn)
		c.mu.Lock()
		c.raw = nc
		c.mu.Unlock()
	}
	c.upgrading()
	return c.fenced(nc), nil
}

func (c *conn) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	nc, err := c.dialTCP(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.link.Phase(core.PhaseTLS)
	c.layers(func(cs *core.ConnState) { cs.TLS = core.LayerConnecting })
	cfg := &tls.Config{}
	if c.t.cfg.TLSConfig != nil {
		cfg = c.t.cfg.TLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	// Uncompressed, the connection can park as a plain one does (see
	// recordConn).
	under, rec := nc, (*recordConn)(nil)
	if c.t.cfg.Compression == NoCompression && canWaitReadable {
		rec = newRecordConn(nc)
		under = rec
	}
	tc := tls.Client(under, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		c.layers(func(cs *core.ConnState) { cs.TLS = core.LayerFailed })
		return nil, transient(faultTLS, fmt.Errorf("tls: %w", err))
	}
	var out net.Conn = tc
	if rec != nil {
		out = newTLSIdleConn(tc, rec)
	}
	c.idle, _ = out.(*idleConn)
	c.mu.Lock()
	c.raw = out
	c.mu.Unlock()
	c.layers(func(cs *core.ConnState) { cs.TLS = core.LayerOK })
	c.upgrading()
	return c.fenced(out), nil
}

func (c *conn) upgrading() {
	c.link.Phase(core.PhaseUpgrade)
	c.layers(func(cs *core.ConnState) { cs.WS = core.LayerConnecting })
}

// wait waits, when gorilla holds no unread byte, until the socket has
// one. It returns true instead when the connection should park: the last
// wait was long (or a handshake just ended), so this one likely is too.
// Compressed connections never wait here: their decompressor holds state
// mid-stream, and they read through gorilla as usual.
func (c *conn) wait() (park bool) {
	if c.inf != nil || c.idle == nil || !c.idle.t.quiet(c.messages) || c.idle.buffered() {
		return false
	}
	if c.lazy && canPark && !c.phase().closing() {
		return true
	}
	c.idle.waitReadable()
	c.lazy = c.t.clock.Now().Sub(c.quietSince) >= parkAfter
	return false
}

// readOne reads one payload and acts on it, unless a failure was reported
// or a close recorded meanwhile: nothing reaches the sink or the core
// after that.
func (c *conn) readOne(ws *websocket.Conn) error {
	b, buf, err := c.next(ws)
	if err != nil {
		return err
	}
	if !c.phase().open() {
		err = errClosing
	} else {
		err = c.handle(b)
	}
	if buf != nil {
		putBuf(buf)
	}
	return err
}

// next returns the next payload and the pooled buffer holding it (nil when
// none was taken).
func (c *conn) next(ws *websocket.Conn) ([]byte, *[]byte, error) {
	if c.inf != nil {
		return c.inf.next()
	}
	mt, r, err := ws.NextReader()
	if err != nil {
		return nil, nil, err
	}
	if c.messages == 0 {
		// The first message is Hello. A binary one means the gateway
		// compresses; a text one means it ignored the request, and the
		// frame type is what counts (Fluxer's overview says so).
		if mt == websocket.BinaryMessage && c.t.cfg.Compression != NoCompression {
			inf, err := newInflater(c.t.cfg.Compression, r, c.source(ws))
			if err != nil {
				return nil, nil, err
			}
			c.inf = inf
			if c.t.cfg.Flavor == core.Fluxer {
				c.wmu.Lock()
				c.zout = true
				c.wmu.Unlock()
			}
			return inf.next()
		}
	}
	if mt != websocket.TextMessage {
		return nil, nil, transient(faultProtocol, errBinaryFrame)
	}
	buf := getBuf()
	b, err := readMessage(r, (*buf)[:0])
	*buf = b
	if err != nil {
		putBuf(buf)
		return nil, nil, err
	}
	c.messages++
	if c.idle != nil && c.idle.t.quiet(c.messages) && !c.idle.buffered() {
		// Taken before the message is handled: how long the reader then
		// takes (the sink, a busy CPU) says nothing about how often the
		// gateway sends, and a test that steps the clock after the sink's
		// delivery must find the wait starting before its step.
		c.quietSince = c.t.clock.Now()
	}
	return b, buf, nil
}

func (c *conn) source(ws *websocket.Conn) messageSource {
	return func() (io.Reader, bool, error) {
		if c.phase().closing() {
			return nil, false, errClosing
		}
		mt, r, err := ws.NextReader()
		return r, mt == websocket.BinaryMessage, err
	}
}

// readMessage reads one message into b, refusing more than MaxMessage.
func readMessage(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(max(len(b), 512), MaxMessage+1-len(b)))
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > MaxMessage {
			return b, errTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// handle acts on one payload.
func (c *conn) handle(b []byte) error {
	p, err := parsePayload(b)
	if err != nil {
		return transient(faultProtocol, fmt.Errorf("malformed payload: %w", err))
	}
	if c.phase() == phaseHello && p.op != opHello {
		return transient(faultProtocol, fmt.Errorf("op %d before Hello", p.op))
	}
	switch p.op {
	case opDispatch:
		return c.dispatch(&p)
	case opHeartbeatACK:
		c.acked()
		return nil
	case opHeartbeat:
		c.heartbeatNow()
		return nil
	case opHello:
		if c.phase() != phaseHello {
			return transient(faultProtocol, errors.New("second Hello on one connection"))
		}
		return c.hello(p.d)
	case opReconnect:
		return &connError{class: core.Transient, fault: faultProtocol, now: true, err: errors.New("gateway asked to reconnect (op 7)")}
	case opInvalidSession:
		return c.invalidSession(p.d)
	}
	if c.t.cfg.Flavor == core.Fluxer {
		// Fluxer: "A client SHOULD log an unknown opcode and ignore the
		// frame, and MUST NOT close or reconnect solely because the server
		// used an opcode newer than this registry." Op 12 (Gateway Error)
		// concerns voice, which shardfs does not join.
		c.t.log.Debug("gateway: ignored opcode", "shard", c.a.Shard, "op", p.op)
		return nil
	}
	return transient(faultProtocol, fmt.Errorf("unknown opcode %d", p.op))
}

func (c *conn) hello(d []byte) error {
	ms, err := helloInterval(d)
	if err != nil {
		return transient(faultProtocol, err)
	}
	interval := time.Duration(ms) * time.Millisecond
	now := c.t.clock.Now()
	jitter := time.Duration(float64(interval) * c.t.cfg.Rand())
	var (
		pl   []byte
		cp   core.Phase
		next phase
		what string
	)
	if c.a.Resume {
		pl, err = c.resumePayload()
		cp, next, what = core.PhaseResume, phaseResuming, "RESUMED"
	} else {
		pl, err = c.identifyPayload()
		cp, next, what = core.PhaseIdentify, phaseIdentifying, "READY"
	}
	if err != nil {
		return transient(faultProtocol, err)
	}
	c.mu.Lock()
	if !c.setPhaseLocked(phaseHello, next) {
		c.mu.Unlock()
		return errClosing
	}
	c.interval = interval
	c.hbNext = now.Add(jitter)
	c.waitUntil, c.waitWhat = now.Add(c.t.cfg.ReadyTimeout), what
	if !c.a.Resume && c.t.cfg.Flavor == core.Discord {
		if t := c.t.gate.reserve(c.a.Shard, now); t.at.After(now) {
			// The bucket's previous identify is too recent: the timer
			// sends this one when the gate says (see tick).
			c.ticket, c.pendingID = &t, pl
			c.waitUntil = c.ticket.at.Add(c.t.cfg.ReadyTimeout)
			c.armLocked(now)
			c.mu.Unlock()
			c.link.Phase(cp)
			return nil
		}
	}
	c.armLocked(now)
	ws := c.ws
	c.mu.Unlock()
	if next == phaseResuming {
		c.claim()
	}
	c.link.Phase(cp)
	if next == phaseIdentifying {
		if e := c.identifyLate(); e != nil {
			return e
		}
	}
	if err := c.write(ws, pl); err != nil {
		return &connError{class: core.Transient, fault: faultIO, err: fmt.Errorf("write: %w", err)}
	}
	if next == phaseIdentifying && c.t.cfg.Flavor == core.Discord {
		c.t.gate.wrote(c.a.Shard, c.t.clock.Now())
	}
	return nil
}

type identifyProps struct {
	OS      string `json:"os"`
	Browser string `json:"browser"`
	Device  string `json:"device"`
}

func (c *conn) identifyPayload() ([]byte, error) {
	var d struct {
		Token      string        `json:"token"`
		Intents    *uint64       `json:"intents,omitempty"` // Fluxer has no intents
		Properties identifyProps `json:"properties"`
		Shard      [2]int        `json:"shard"`
	}
	d.Token = c.t.token
	if c.t.cfg.Flavor == core.Discord {
		intents := c.t.cfg.Intents
		d.Intents = &intents
	}
	d.Properties = identifyProps{OS: "shardfs", Browser: "shardfs", Device: "shardfs"}
	d.Shard = [2]int{c.a.Shard, c.a.Total}
	return json.Marshal(struct {
		Op int `json:"op"`
		D  any `json:"d"`
	}{opIdentify, d})
}

func (c *conn) resumePayload() ([]byte, error) {
	type resume struct {
		Token     string `json:"token"`
		SessionID string `json:"session_id"`
		Seq       int64  `json:"seq"`
	}
	return json.Marshal(struct {
		Op int    `json:"op"`
		D  resume `json:"d"`
	}{opResume, resume{c.t.token, c.a.Session.ID, c.a.Sequence}})
}

// dispatch hands one dispatch to the sink and its sequence to the core.
func (c *conn) dispatch(p *payload) error {
	var name string
	if p.nameEscaped {
		name, _ = wire.String(append(append([]byte{'"'}, p.name...), '"'))
	} else {
		name = c.t.names.get(p.name)
	}
	seq := p.seq
	// In a fleet the event waits for a confirmation of the lease that
	// started after it was read (core.Link.Confirmed): a node thawed
	// from a VM freeze delivers nothing.
	if !c.link.Confirmed() {
		return transient(faultProtocol, errUnconfirmed)
	}
	switch name {
	case "READY":
		return c.ready(p.d, seq)
	case "RESUMED":
		return c.resumed(p.d, seq)
	}
	if seq >= 0 {
		if last := c.seq.Load(); last >= 0 && seq <= last {
			return transient(faultProtocol, fmt.Errorf("sequence went backwards: %d after %d", seq, last))
		}
	}
	if c.phase().handshaking() {
		c.progress()
	}
	if seq < 0 {
		c.deliver(seq, name, p.d)
		return nil
	}
	c.seq.Store(seq)
	// Delivered and counted together, under the shard's lock (see
	// core.Link.DispatchDo): a dispatch that arrives as the core stops the
	// shard for a snapshot is neither, and the next resume replays it.
	c.link.DispatchDo(seq, func() { c.deliver(seq, name, p.d) })
	return nil
}

// deliver hands a dispatch to the sink unless the sink already has it (see
// shardRecord), the connection is closing, or the connection's fence is
// closed: nothing read after the lease's deadline reaches the dispatch
// logs or the relay (core.Fence; the core checks it too before counting).
func (c *conn) deliver(seq int64, name string, d []byte) {
	sink := c.t.cfg.Sink
	if sink == nil || !c.a.Fence.Open(c.t.clock) {
		return
	}
	r := c.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.phase().closing() || r.session != c.sid {
		return
	}
	if seq >= 0 {
		if seq <= r.last {
			return
		}
		r.last = seq
	}
	sink(c.a.Shard, c.skey, seq, name, d)
}

// claim makes the resumed session the one the shard's sink follows. A
// record of another session (or none: a session this transport never saw
// start) starts over at the resumed sequence; the same session keeps its
// record, which may be ahead of the core by the event an old connection
// was delivering.
func (c *conn) claim() {
	r := c.rec
	r.mu.Lock()
	if r.session != c.sid {
		r.session, r.last = c.sid, c.a.Sequence
	}
	r.mu.Unlock()
}

func (c *conn) ready(d []byte, seq int64) error {
	sid, resumeURL := readyFields(d)
	if sid == "" {
		return transient(faultProtocol, errors.New("READY has no session_id"))
	}
	if c.t.cfg.Flavor == core.Fluxer || resumeURL == "" {
		// Fluxer publishes no resume URL: a resume reconnects to the
		// endpoint the client discovered.
		resumeURL = c.base
	} else if u, err := wsURL(resumeURL); err != nil || u.Scheme == "ws" && strings.HasPrefix(c.base, "wss:") {
		// A resume URL that is malformed or would drop TLS is not used:
		// the token goes with the Resume.
		resumeURL = c.base
	}
	seq = max(seq, 0)
	if err := c.endHandshake("READY", phaseIdentifying, phaseResuming, phaseLive); err != nil {
		return err
	}
	c.sid, c.skey = sid, core.SessionKey(sid)
	c.seq.Store(seq)
	if sink := c.t.cfg.Sink; sink != nil && c.a.Fence.Open(c.t.clock) {
		red := redactReady(d)
		r := c.rec
		r.mu.Lock()
		if !c.phase().closing() {
			r.session, r.last = sid, seq
			sink(c.a.Shard, c.skey, seq, "READY", red)
		}
		r.mu.Unlock()
	}
	if on := c.t.cfg.OnSession; on != nil {
		on(c.a.Shard, core.Session{ID: sid, ResumeURL: resumeURL}, seq)
	}
	c.link.Ready(core.Session{ID: sid, ResumeURL: resumeURL}, seq)
	return nil
}

func (c *conn) resumed(d []byte, seq int64) error {
	if c.phase() != phaseResuming {
		return nil // not ours to act on: the core drops it too
	}
	if err := c.endHandshake("RESUMED", phaseResuming); err != nil {
		return err
	}
	// Fluxer's RESUMED carries the session's current sequence, which may
	// lie past the last replayed event when some were never retained.
	if seq > c.seq.Load() {
		c.seq.Store(seq)
	}
	c.deliver(-1, "RESUMED", d)
	c.link.Resumed(c.seq.Load())
	return nil
}

func (c *conn) invalidSession(d []byte) error {
	if c.t.cfg.Flavor == core.Fluxer {
		// Fluxer keeps the socket open, unauthenticated; the core asks the
		// pacer and then calls Identify.
		c.mu.Lock()
		p := c.phase()
		if !p.open() {
			c.mu.Unlock()
			return errClosing
		}
		c.setPhaseLocked(p, phaseInvalidated)
		c.sid, c.skey = "", ""
		c.seq.Store(-1)
		c.waitUntil = time.Time{}
		c.armLocked(c.t.clock.Now())
		c.mu.Unlock()
		c.link.Invalidated()
		return nil
	}
	if string(bytes.TrimSpace(d)) == "true" {
		return transient(faultProtocol, errors.New("session invalidated (op 9), resumable"))
	}
	return &connError{class: core.NewSession, fault: faultProtocol, err: errors.New("session invalidated (op 9)")}
}

// progress pushes the READY/RESUMED deadline out while a replay or the
// guilds after an identify keep arriving.
func (c *conn) progress() {
	now := c.t.clock.Now()
	c.mu.Lock()
	if !c.waitUntil.IsZero() {
		c.waitUntil = now.Add(c.t.cfg.ReadyTimeout)
	}
	c.mu.Unlock()
}

// endHandshake makes the connection live on READY or RESUMED (what),
// which may come in one of the phases from.
func (c *conn) endHandshake(what string, from ...phase) error {
	c.mu.Lock()
	p := c.phase()
	if !p.open() {
		c.mu.Unlock()
		return errClosing
	}
	if !phases(from...).Has(p) {
		c.mu.Unlock()
		return transient(faultProtocol, fmt.Errorf("%s while %v", what, p))
	}
	c.setPhaseLocked(p, phaseLive)
	c.waitUntil = time.Time{}
	c.armLocked(c.t.clock.Now())
	c.mu.Unlock()
	// A new session is followed by a burst (GUILD_CREATEs, a replay), then
	// most shards fall quiet: park at the first wait after the burst
	// rather than after a second one.
	c.lazy = true
	return nil
}

// armLocked points the connection's one timer at the earlier of the next
// heartbeat and the Hello or READY deadline.
func (c *conn) armLocked(now time.Time) {
	next := c.hbNext
	if !c.waitUntil.IsZero() && (next.IsZero() || c.waitUntil.Before(next)) {
		next = c.waitUntil
	}
	if c.pendingID != nil && (next.IsZero() || c.ticket.at.Before(next)) {
		next = c.ticket.at
	}
	if next.IsZero() || !c.phase().open() {
		if c.timer != nil {
			c.timer.Stop()
		}
		return
	}
	d := next.Sub(now)
	if c.timer == nil {
		c.timer = c.t.clock.AfterFunc(d, c.tick)
	} else {
		c.timer.Reset(d)
	}
}

// tick runs when the timer fires: a timeout, a heartbeat, a zombie, or an
// identify the gate held back.
func (c *conn) tick() {
	if !c.t.life.enter() {
		return
	}
	defer c.t.life.leave()
	defer c.link.Recover()
	now := c.t.clock.Now()
	c.mu.Lock()
	if !c.phase().open() {
		c.mu.Unlock()
		return
	}
	var e *connError
	beat, missed := false, false
	switch {
	case !c.waitUntil.IsZero() && !now.Before(c.waitUntil):
		e = transient(faultStalled, fmt.Errorf("no %s within %v", c.waitWhat, c.waitTimeout()))
	case !c.hbNext.IsZero() && !now.Before(c.hbNext):
		// Discord: no ACK between two heartbeats means a zombied
		// connection. Half an interval of slack keeps a heartbeat the
		// gateway asked for just before this one from counting.
		if c.awaiting && now.Sub(c.unacked) >= c.interval/2 {
			missed = true
			e = &connError{class: core.Transient, fault: faultStalled, code: 4000,
				err: fmt.Errorf("heartbeat not acknowledged for %v: zombie connection", now.Sub(c.unacked))}
		} else {
			beat = true
			c.markSentLocked(now)
			c.hbNext = now.Add(c.interval)
		}
	}
	var identify []byte
	if e == nil && c.pendingID != nil && !now.Before(c.ticket.at) {
		identify, c.pendingID = c.pendingID, nil
	}
	if e == nil {
		c.armLocked(now)
	}
	ws := c.ws
	c.mu.Unlock()
	if e != nil {
		if missed {
			c.link.HeartbeatMissed() // before the failure: it counts on this connection
		}
		c.report(e)
		return
	}
	if beat {
		c.writeHeartbeat(ws)
	}
	if identify != nil {
		if e := c.identifyLate(); e != nil {
			c.report(e)
			return
		}
		if err := c.write(ws, identify); err != nil {
			c.writeFailed(err)
		} else {
			c.t.gate.wrote(c.a.Shard, c.t.clock.Now())
		}
	}
}

func (c *conn) waitTimeout() time.Duration {
	if c.waitWhat == "Hello" {
		return c.t.cfg.HelloTimeout
	}
	return c.t.cfg.ReadyTimeout
}

func (c *conn) markSentLocked(now time.Time) {
	if !c.awaiting {
		c.awaiting, c.unacked = true, now
	}
	c.sentAt = now
}

// heartbeatNow answers the gateway's op 1 at once. When the previous
// heartbeat was acknowledged, the schedule restarts from this one: a
// regular beat moments later would tell the gateway nothing new, and
// Fluxer asks at 90% of every interval. When it was not, the schedule
// stays, so that the zombie check is not put off.
func (c *conn) heartbeatNow() {
	now := c.t.clock.Now()
	c.mu.Lock()
	if !c.awaiting && !c.hbNext.IsZero() {
		c.hbNext = now.Add(c.interval)
		c.armLocked(now)
	}
	c.markSentLocked(now)
	ws := c.ws
	c.mu.Unlock()
	c.writeHeartbeat(ws)
}

func (c *conn) acked() {
	now := c.t.clock.Now()
	c.mu.Lock()
	was, latency := c.awaiting, now.Sub(c.sentAt)
	c.awaiting = false
	c.mu.Unlock()
	if was {
		c.link.Heartbeat(latency)
	}
}

// writeHeartbeat sends op 1 with the last sequence handed to the sink:
// Fluxer trims its replay buffer to it, so it must be one already
// processed.
func (c *conn) writeHeartbeat(ws *websocket.Conn) {
	var buf [40]byte
	b := append(buf[:0], `{"op":1,"d":`...)
	if s := c.seq.Load(); s >= 0 {
		b = strconv.AppendInt(b, s, 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, '}')
	if err := c.write(ws, b); err != nil {
		c.writeFailed(err)
	}
}

// write sends one payload, through the zstd stream when Fluxer's stream=1
// is in effect.
func (c *conn) write(ws *websocket.Conn, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	if !c.zout {
		return ws.WriteMessage(websocket.TextMessage, p)
	}
	w, err := ws.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	if !c.zhdr {
		if _, err := w.Write(zstdRawHeader); err != nil {
			return err
		}
		c.zhdr = true
	}
	h := zstdRawBlock(len(p))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	return w.Close()
}

func (c *conn) writeFailed(err error) {
	if c.phase().closing() {
		return
	}
	c.report(&connError{class: core.Transient, fault: faultIO, err: fmt.Errorf("write: %w", err)})
}

// report tells the core about the connection's failure, once, unless the
// connection was closed on purpose, and then closes it (see phase).
func (c *conn) report(e *connError) {
	c.mu.Lock()
	p := c.phase()
	if p >= phaseFailed || !c.setPhaseLocked(p, phaseFailed) {
		c.mu.Unlock()
		return
	}
	e.apply(&c.cs)
	cs := c.cs
	c.mu.Unlock()
	f := core.Failure{Class: e.class, Err: e, Code: e.code}
	// The token's refusal is the bot's, not the shard's: the core sends
	// every shard FATAL at once rather than spend an identify on each.
	f.Token = e.class == core.FatalFailure && (e.code == 4004 || errors.Is(e, ErrUnauthorized))
	if e.now {
		f.Deadline = c.t.clock.Now()
	}
	c.t.log.Debug("gateway: connection failed", "shard", c.a.Shard, "class", e.class.String(), "code", e.code, "err", e.Error())
	c.link.Transport(cs)
	c.link.Fail(f)
	c.Close(closeCodeFor(e.class)) // the core's own Close came first and wins
}

// end settles a connection whose reader stopped: it reports the failure
// and closes the WebSocket the way its ending calls for.
func (c *conn) end(ws *websocket.Conn, err error) {
	if !c.phase().closing() {
		e := c.classify(err)
		c.report(e)
		if e.fault == faultServer || e.fault == faultIO || errors.Is(e, errUnconfirmed) {
			// The gateway closed (gorilla answered its close frame) or the
			// socket broke: nothing is left to say.
			_ = ws.NetConn().Close()
			return
		}
		c.Close(4000) // only if no code was set: another reporter raced this one
		c.closeHandshake(ws, c.code())
		return
	}
	var wc *websocket.CloseError
	var ne net.Error
	switch {
	case errors.As(err, &wc) && wc.Code != websocket.CloseAbnormalClosure:
		_ = ws.NetConn().Close()
	case errors.Is(err, errClosing), errors.As(err, &ne) && ne.Timeout():
		// Woken by Close's read deadline.
		c.closeHandshake(ws, c.code())
	default:
		_ = ws.NetConn().Close()
	}
}

func (c *conn) code() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeCode
}

// closeHandshake sends the client's close frame and waits, briefly, for
// the gateway to close its side, so that the frame is read before the
// socket goes: whether a session survives depends on its code.
func (c *conn) closeHandshake(ws *websocket.Conn, code int) {
	nc := ws.NetConn()
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(writeTimeout))
	_ = nc.SetReadDeadline(time.Now().Add(closeGrace))
	var buf [512]byte
	for {
		if _, err := nc.Read(buf[:]); err != nil {
			break
		}
	}
	_ = nc.Close()
}
