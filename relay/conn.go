package relay

import (
	"bytes"
	"compress/zlib"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/wire"
)

// The gateway's figures that a client sees from the relay.
const (
	heartbeatInterval = 41250 * time.Millisecond
	fluxerHeartbeat   = 45 * time.Second           // Fluxer closes 4009 after this without one
	fluxerAsk         = heartbeatInterval * 9 / 10 // and asks for one with op 1 after this
	maxPayload        = 4096                       // a client message, as both gateways take
	sendLimit         = 120                        // client messages per sendWindow, as Discord's
	fluxerSendLimit   = 500                        // Fluxer's (DESIGN.md section 3's default)
	sendWindow        = time.Minute
	writeTimeout      = 10 * time.Second
	readyWait         = 2 * time.Minute
)

// session is one client's relay session: it outlives its connection for
// the resume window.
type session struct {
	id           string // a secret, like Discord's session id
	client       int
	shard        int
	intents      uint64
	identifiedAt time.Time
	log          sessionLog
	plan         *servedPlan // the plan it identified on
	userID       string      // the bot's, whose voice states are routed
	noContent    bool        // lacks MESSAGE_CONTENT: message content is emptied

	// Guarded by Server.mu.
	conn       *conn
	remote     string
	detachedAt time.Time
	ended      bool

	mu      sync.Mutex // the connection's puller writes; /clients reads
	seq     int64      // last sequence handed out
	base    int64      // the sequence of offs[0]
	offs    []mark     // offs[i]: the journal position after sequence base+i
	cursor  mark       // where the next read starts
	events  uint64     // dispatches delivered
	resumes uint64
}

// sessionLog is what the puller reads from: the shard's journal and cache.
type sessionLog = *shardCache

// mark is a position in a shard's journal: its byte offset and the number
// of lines before it (for the lag in /clients).
type mark struct {
	off   int64
	lines uint64
}

// record notes that sequence seq ends at m.
func (s *session) record(seq int64, m mark) {
	if len(s.offs) == 0 {
		s.base = seq
	}
	s.offs = append(s.offs, m)
	// Keep the marks the journal can still replay from, and a bound.
	if len(s.offs) > 4096 && len(s.offs)%1024 == 0 {
		oldest := s.log.log.Oldest()
		i := 0
		for i < len(s.offs)-1 && s.offs[i].off < oldest {
			i++
		}
		if extra := len(s.offs) - 1<<20; extra > i {
			i = extra
		}
		s.offs = append(s.offs[:0], s.offs[i:]...)
		s.base += int64(i)
	}
}

// conn is one client connection.
type conn struct {
	s      *Server
	ws     *websocket.Conn
	bc     *batchConn // under ws: the puller holds it around a burst
	remote string
	url    string // the relay's URL as the client reached it
	closed chan struct{}
	once   sync.Once

	wmu  sync.Mutex // one writer at a time; guards the compressed stream
	zw   *zlib.Writer
	zs   *zstd.Encoder
	zbuf bytes.Buffer
	zin  *zstdReader // client messages are one zstd stream (Fluxer's stream=1)

	ask clock.Timer // Fluxer: asks for a heartbeat at 90% of the interval

	sess *session // set by the reader once identified or resumed

	pmu     sync.Mutex
	pulling chan struct{} // closed when the puller returns; nil before
	sends   []time.Time   // the client's messages in the last window
}

var upgrader = websocket.Upgrader{
	// Bots are not browsers: no origin to check.
	CheckOrigin:       func(*http.Request) bool { return true },
	EnableCompression: false,
}

func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	full := len(s.conns)+s.upgrading >= s.cfg.MaxConns
	if !full {
		s.upgrading++
	}
	s.mu.Unlock()
	if full {
		s.event("relay-refused", nil, "remote", r.RemoteAddr, "reason", "the relay is full (MaxConns)")
		http.Error(w, "503: the relay is full", http.StatusServiceUnavailable)
		return
	}
	hj := &batchHijacker{ResponseWriter: w}
	ws, err := upgrader.Upgrade(hj, r, nil)
	s.mu.Lock()
	s.upgrading--
	s.mu.Unlock()
	if err != nil {
		return // Upgrade answered the client
	}
	c := &conn{s: s, ws: ws, bc: hj.conn, remote: r.RemoteAddr, url: s.publicURL(r), closed: make(chan struct{})}
	q := r.URL.Query()
	switch compress := q.Get("compress"); {
	case compress == "zstd-stream":
		c.zs = newZstdStream(&c.zbuf)
		if s.fluxer() && q.Get("stream") == "1" {
			c.zin = new(zstdReader)
		}
	case compress == "zlib-stream" && !s.fluxer():
		// Fluxer offers zstd only, and ignores other values as its own
		// parser does.
		c.zw = zlib.NewWriter(&c.zbuf)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.closeWith(4000, "shardfs is shutting down", false)
		return
	}
	s.conns[c] = struct{}{}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()
	defer c.finish()
	s.event("relay-connect", nil, "remote", c.remote)
	switch v := q.Get("v"); {
	case s.fluxer() && v != "1":
		c.closeWith(4012, "Invalid API version", false)
		return
	case s.fluxer():
	case v != "" && v != "10" && v != "9":
		c.closeWith(4012, "Invalid API version", false)
		return
	case q.Get("encoding") != "" && q.Get("encoding") != "json":
		c.closeWith(4002, "Error while decoding payload.", false)
		return
	}
	if s.fluxer() {
		// As Fluxer does, before its 4009 at 45 s; counted from Hello.
		c.ask = s.clock.AfterFunc(fluxerAsk, func() { c.write([]byte(`{"op":1,"d":null}`)) })
		defer c.ask.Stop()
	}
	c.write([]byte(`{"op":10,"s":null,"t":null,"d":{"heartbeat_interval":` + strconv.FormatInt(heartbeatInterval.Milliseconds(), 10) + `}}`))
	c.read()
}

// read handles the client's messages until the connection ends.
func (c *conn) read() {
	for {
		// Discord closes 4009 after an interval and a half without a
		// heartbeat; the relay's own deadline is the same.
		wait := heartbeatInterval * 3 / 2
		if c.s.fluxer() {
			wait = fluxerHeartbeat
		}
		c.ws.SetReadDeadline(time.Now().Add(wait))
		msg, err := c.next()
		if err != nil {
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ce) && (ce.Code == websocket.CloseNormalClosure || ce.Code == websocket.CloseGoingAway):
				if c.sess != nil {
					c.s.endSession(c.sess, "client closed "+strconv.Itoa(ce.Code))
				}
			case errors.Is(err, errTooLarge) || errors.Is(err, errUndecodable) || errors.Is(err, errTextInStream):
				c.closeWith(4002, "Error while decoding payload.", false)
			case isTimeout(err):
				c.closeWith(4009, "Session timed out", false)
			}
			return
		}
		if !c.handle(msg) {
			return
		}
	}
}

var errTooLarge = errors.New("payload too large")

// next reads one client message, refusing one over the gateway's limit
// without reading the rest of it.
func (c *conn) next() ([]byte, error) {
	if c.zin != nil {
		return c.zin.next(c.ws)
	}
	_, r, err := c.ws.NextReader()
	if err != nil {
		return nil, err
	}
	msg, err := io.ReadAll(io.LimitReader(r, maxPayload+1))
	if err != nil {
		return nil, err
	}
	if len(msg) > maxPayload {
		return nil, errTooLarge
	}
	return msg, nil
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// handle acts on one client message; false ends the connection.
func (c *conn) handle(msg []byte) bool {
	if !utf8.Valid(msg) {
		return c.closeWith(4002, "Error while decoding payload.", false)
	}
	env, err := wire.Read(msg)
	if err != nil {
		return c.closeWith(4002, "Error while decoding payload.", false)
	}
	now := c.s.clock.Now()
	for len(c.sends) > 0 && now.Sub(c.sends[0]) >= sendWindow {
		c.sends = c.sends[1:]
	}
	limit := sendLimit
	if c.s.fluxer() {
		limit = fluxerSendLimit
	}
	if len(c.sends) >= limit {
		return c.closeWith(4008, "Rate limited.", false)
	}
	c.sends = append(c.sends, now)
	switch env.Op {
	case 1:
		// Answered here: the shard's own heartbeats are the node's, and a
		// client's sequence (its own numbering) means nothing upstream.
		if c.ask != nil {
			c.ask.Reset(fluxerAsk)
		}
		if c.s.fluxer() && c.sess != nil {
			// Fluxer's heartbeat names the last sequence processed; one
			// never sent closes 4007, as there.
			if n, ok := wire.Int(env.D); ok && n > c.sess.lastSeq() {
				return c.closeWith(4007, "Invalid seq.", false)
			}
		}
		return c.write([]byte(`{"op":11,"s":null,"t":null,"d":null}`))
	case 2:
		if c.sess != nil {
			return c.closeWith(4005, "Already authenticated.", false)
		}
		return c.identify(env.D)
	case 6:
		if c.sess != nil {
			return c.closeWith(4005, "Already authenticated.", false)
		}
		return c.resume(env.D)
	case 3, 4, 8, 14, 15, 16:
		if env.Op > 8 && !c.s.fluxer() {
			return c.closeWith(4001, "Unknown opcode.", false)
		}
		// Fluxer's 14 (lazy request), 15 and 16 (counts) pass like 3;
		// their replies reach every client of the shard.
		if c.sess == nil {
			return c.closeWith(4003, "Not authenticated.", false)
		}
		return c.command(env.Op, msg, env.D)
	default:
		return c.closeWith(4001, "Unknown opcode.", false)
	}
}

// validIntents are the intent bits Discord defines.
const validIntents = 1<<17 - 1 | 1<<20 | 1<<21 | 1<<24 | 1<<25

func (c *conn) identify(d []byte) bool {
	var id struct {
		Token    string           `json:"token"`
		Intents  *uint64          `json:"intents"`
		Shard    []int            `json:"shard"`
		Presence *json.RawMessage `json:"presence"`
	}
	if json.Unmarshal(d, &id) != nil {
		return c.closeWith(4002, "Error while decoding payload.", false)
	}
	s := c.s
	if !s.tokenOK(id.Token) {
		s.event("relay-refused", nil, "remote", c.remote, "reason", "wrong token")
		return c.closeWith(4004, "Authentication failed.", false)
	}
	shard, total := 0, 1
	if id.Shard != nil {
		if len(id.Shard) != 2 {
			return c.closeWith(4010, "Invalid shard.", false)
		}
		shard, total = id.Shard[0], id.Shard[1]
	}
	plan := s.current()
	switch {
	case total < plan.total:
		// Fewer shards than the plan: what the gateway says to a bot
		// that has outgrown them (and, after a move, to the old plan's).
		return c.closeWith(4011, "Sharding required.", false)
	case total != plan.total || shard < 0 || shard >= total || plan.shards[shard] == nil:
		s.event("relay-refused", nil, "remote", c.remote, "reason", "shard "+strconv.Itoa(shard)+" of "+strconv.Itoa(total)+" is not served here")
		return c.closeWith(4010, "Invalid shard.", false)
	case s.fluxer():
		// Fluxer has no intents: whatever the identify says is ignored.
		all := uint64(validIntents)
		id.Intents = &all
	case id.Intents == nil || *id.Intents&^validIntents != 0:
		return c.closeWith(4013, "Invalid intent(s).", false)
	}
	cache := plan.shards[shard]
	snap := c.waitReady(cache)
	if snap == nil {
		return c.closeWith(4000, "the shard has no session yet", false)
	}
	sess := &session{id: newSessionID(), shard: shard, intents: *id.Intents & s.cfg.Intents, userID: snap.userID,
		identifiedAt: s.clock.Now(), log: cache, plan: plan, remote: c.remote}
	if s.cfg.Intents == 0 || s.fluxer() {
		sess.intents = *id.Intents // a node without intents filters nothing
	}
	sess.noContent = !s.fluxer() && sess.intents&intentMessageContent == 0
	s.mu.Lock()
	if s.current() != plan {
		s.mu.Unlock()
		return c.closeWith(4011, "Sharding required.", false) // a move came first
	}
	s.sweepLocked()
	s.nextID++
	sess.client = s.nextID
	s.sessions[sess.id] = sess
	s.clients[sess.client] = sess
	sess.conn = c
	s.mu.Unlock()
	c.setSession(sess)
	s.event("relay-identify", sess, "remote", c.remote, "intents", strconv.FormatUint(sess.intents, 10))

	ready := make(map[string]json.RawMessage, len(snap.ready)+4)
	for k, v := range snap.ready {
		ready[k] = v
	}
	ready["session_id"] = mustMarshal(sess.id)
	ready["resume_gateway_url"] = mustMarshal(c.resumeURL())
	if s.fluxer() {
		// Fluxer resumes at the URL the client connected to.
		delete(ready, "resume_gateway_url")
	}
	ready["shard"] = mustMarshal([]int{shard, total})
	guilds := make([]map[string]any, len(snap.guildIDs))
	for i, g := range snap.guildIDs {
		guilds[i] = map[string]any{"id": g, "unavailable": true}
	}
	ready["guilds"] = mustMarshal(guilds)
	sess.mu.Lock()
	sess.cursor = mark{snap.offset, snap.lines}
	frames := [][]byte{dispatchFrame(nil, sess.next(), "READY", mustMarshal(ready))}
	if sess.intents&intentGuilds != 0 {
		for _, g := range snap.guildCreates {
			frames = append(frames, dispatchFrame(nil, sess.next(), "GUILD_CREATE", g))
		}
	}
	sess.mu.Unlock()
	for _, f := range frames {
		if !c.write(f) {
			return false
		}
	}
	if id.Presence != nil && string(*id.Presence) != "null" {
		// What the bot asked for at identify, as the real gateway would set it.
		p := append(append([]byte(`{"op":3,"d":`), *id.Presence...), '}')
		if err := plan.send(shard, p); err != nil {
			s.log.Debug("identify presence refused", "shard", shard, "err", err)
		}
	}
	c.startPuller(false)
	return true
}

// next hands out the next sequence, at the cursor. Call with s.mu held.
func (s *session) next() int64 {
	s.seq++
	s.record(s.seq, s.cursor)
	return s.seq
}

// resumeURL is the URL the client reached, for READY's resume_gateway_url.
func (c *conn) resumeURL() string { return c.url }

// waitReady waits for the shard's first READY.
func (c *conn) waitReady(cache *shardCache) *snapshot {
	deadline := time.After(readyWait)
	for {
		ch := cache.notify()
		if snap := cache.snapshot(); snap != nil {
			return snap
		}
		select {
		case <-ch:
		case <-deadline:
			return nil
		case <-c.closed:
			return nil
		case <-c.s.done:
			return nil
		}
	}
}

func (c *conn) resume(d []byte) bool {
	var r struct {
		Token     string `json:"token"`
		SessionID string `json:"session_id"`
		Seq       *int64 `json:"seq"`
	}
	if json.Unmarshal(d, &r) != nil {
		return c.closeWith(4002, "Error while decoding payload.", false)
	}
	s := c.s
	if !s.tokenOK(r.Token) {
		s.event("relay-refused", nil, "remote", c.remote, "reason", "wrong token")
		return c.closeWith(4004, "Authentication failed.", false)
	}
	s.mu.Lock()
	s.sweepLocked()
	sess := s.sessions[r.SessionID]
	var old *conn
	if sess != nil {
		old = sess.conn
	}
	s.mu.Unlock()
	if sess == nil {
		s.event("relay-resume-refused", nil, "remote", c.remote, "reason", "unknown or expired session")
		return c.write([]byte(`{"op":9,"s":null,"t":null,"d":false}`))
	}
	if old != nil {
		// The session moves to this connection, as on Discord.
		old.closeWith(4000, "the session resumed on another connection", false)
		<-old.pullerDone()
	}
	sess.mu.Lock()
	seq := int64(0)
	if r.Seq != nil {
		seq = *r.Seq
	}
	if seq > sess.seq {
		sess.mu.Unlock()
		return c.closeWith(4007, "Invalid seq.", false)
	}
	i := seq - sess.base
	if i < 0 || i >= int64(len(sess.offs)) || sess.offs[i].off < sess.log.log.Oldest() {
		sess.mu.Unlock()
		s.endSession(sess, "resume past the replay")
		s.event("relay-resume-refused", sess, "remote", c.remote, "reason", "sequence no longer retained")
		return c.write([]byte(`{"op":9,"s":null,"t":null,"d":false}`))
	}
	sess.cursor = sess.offs[i]
	sess.offs = sess.offs[:i+1]
	sess.seq = seq
	sess.resumes++
	sess.mu.Unlock()
	s.mu.Lock()
	if sess.ended || s.closed {
		s.mu.Unlock()
		return c.write([]byte(`{"op":9,"s":null,"t":null,"d":false}`))
	}
	sess.conn, sess.remote = c, c.remote
	s.mu.Unlock()
	c.setSession(sess)
	s.event("relay-resume", sess, "remote", c.remote, "seq", strconv.FormatInt(seq, 10))
	c.startPuller(true)
	return true
}

// command passes op 3, 4 or 8 to the shard's paced send path, noting who
// asked so that the reply finds the client.
func (c *conn) command(op int, msg, d []byte) bool {
	s, sess := c.s, c.sess
	payload := msg
	switch op {
	case 4:
		if g, ok := wire.Member(d, "guild_id"); ok {
			if gid, ok := wire.String(g); ok {
				s.mu.Lock()
				s.voice[gid] = sess
				s.mu.Unlock()
			}
		}
	case 8:
		var f map[string]json.RawMessage
		if json.Unmarshal(d, &f) != nil {
			return c.closeWith(4002, "Error while decoding payload.", false)
		}
		s.mu.Lock()
		s.nonceSeq++
		nonce := "relay" + strconv.FormatUint(s.nonceSeq, 36)
		s.nonces[nonce] = nonceOwner{sess: sess, nonce: f["nonce"]}
		if len(s.nonces) > 4096 {
			// The oldest requests' chunks are long gone.
			for k := range s.nonces {
				if n, err := strconv.ParseUint(k[5:], 36, 64); err == nil && n+4096 <= s.nonceSeq {
					delete(s.nonces, k)
				}
			}
		}
		s.mu.Unlock()
		f["nonce"] = mustMarshal(nonce)
		payload = mustMarshal(map[string]any{"op": 8, "d": f})
	}
	if sess.plan != s.current() {
		return c.closeWith(4011, "Sharding required.", false) // the plan it knew is gone
	}
	if err := sess.plan.send(sess.shard, payload); err != nil {
		s.event("relay-send-refused", sess, "op", strconv.Itoa(op), "reason", err.Error())
		return c.closeWith(4008, "Rate limited.", false)
	}
	return true
}

// dispatchFrame appends an op 0 frame to b.
func dispatchFrame(b []byte, seq int64, t string, d []byte) []byte {
	b = append(b, `{"op":0,"s":`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"t":"`...)
	b = append(b, t...)
	b = append(b, `","d":`...)
	b = append(b, d...)
	return append(b, '}')
}

// write sends one message; false when the connection is gone.
func (c *conn) write(msg []byte) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(msg) == nil
}

func (c *conn) writeLocked(msg []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	c.zbuf.Reset()
	switch {
	case c.zw != nil:
		c.zw.Write(msg)
		c.zw.Flush() // a sync flush: the message ends 00 00 ff ff
	case c.zs != nil:
		c.zs.Write(msg)
		c.zs.Flush() // the message's blocks; the frame never ends
	default:
		return c.ws.WriteMessage(websocket.TextMessage, msg)
	}
	return c.ws.WriteMessage(websocket.BinaryMessage, c.zbuf.Bytes())
}

// closeWith closes the connection with code and reason; end also ends
// its session. It returns false, for handle.
func (c *conn) closeWith(code int, reason string, end bool) bool {
	c.once.Do(func() {
		sess := c.session()
		if end && sess != nil {
			c.s.endSession(sess, reason)
		}
		// WriteControl may run beside a write the puller has blocked.
		c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
		c.ws.Close()
		close(c.closed)
		c.s.event("relay-close", sess, "remote", c.remote, "code", strconv.Itoa(code), "reason", reason)
	})
	return false
}

// finish runs when the reader returns: the session stays resumable
// unless it ended.
func (c *conn) finish() {
	closed := false
	c.once.Do(func() {
		c.ws.Close()
		close(c.closed)
		closed = true
	})
	<-c.pullerDone()
	if c.zin != nil {
		c.zin.close()
	}
	c.wmu.Lock()
	if c.zs != nil {
		c.zs.Close()
	}
	c.wmu.Unlock()
	s := c.s
	s.mu.Lock()
	delete(s.conns, c)
	if sess := c.sess; sess != nil && sess.conn == c {
		sess.conn, sess.detachedAt = nil, s.clock.Now()
	}
	s.mu.Unlock()
	// After the detach, so that a reader of the events log sees the
	// session resumable.
	if closed {
		c.s.event("relay-close", c.sess, "remote", c.remote, "reason", "connection ended")
	} else {
		c.s.event("relay-detach", c.sess, "remote", c.remote)
	}
}

// setSession and session guard c.sess for the goroutines other than the
// reader (which sets it) and the puller (started after).
func (c *conn) setSession(sess *session) {
	c.pmu.Lock()
	c.sess = sess
	c.pmu.Unlock()
}

func (c *conn) session() *session {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.sess
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *conn) pullerDone() <-chan struct{} {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.pulling == nil {
		return closedChan
	}
	return c.pulling
}

// endSession ends a session: it is no longer resumable.
func (s *Server) endSession(sess *session, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endSessionLocked(sess, why)
}

func (s *Server) endSessionLocked(sess *session, why string) {
	if sess.ended {
		return
	}
	sess.ended = true
	delete(s.sessions, sess.id)
	delete(s.clients, sess.client)
	for g, v := range s.voice {
		if v == sess {
			delete(s.voice, g)
		}
	}
	s.event("relay-session-end", sess, "reason", why)
}

// sweepLocked ends the detached sessions past the resume window.
func (s *Server) sweepLocked() {
	now := s.clock.Now()
	for _, sess := range s.sessions {
		if sess.conn == nil && !sess.detachedAt.IsZero() && now.Sub(sess.detachedAt) > s.cfg.ResumeWindow {
			s.endSessionLocked(sess, "resume window passed")
		}
	}
}

// lastSeq is the last sequence handed to the client.
func (s *session) lastSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq
}
