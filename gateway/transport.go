package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// Sink receives every dispatch, synchronously, from the connection's reader:
// shard, the session key (core.SessionKey; empty before READY), sequence
// (-1 for RESUMED and for a dispatch without one), the event name and its
// raw d. d is strict JSON in UTF-8, and the name UTF-8
// (invalid bytes from the gateway are replaced with U+FFFD). d is valid
// only during the call; a sink that keeps it must copy it. A slow sink
// slows its shard and nothing else.
type Sink func(shard int, session string, seq int64, name string, d []byte)

// Config configures a Transport. Flavor and Token are required.
type Config struct {
	Flavor core.Flavor
	// Token is the bot token, with or without an HTTP "Bot " prefix. It is
	// sent in identify, resume and the discovery request, and nowhere else.
	Token string
	// Intents is the Discord intents bit field (Fluxer has none).
	Intents uint64
	// API is the HTTP API base for discovery; empty means DiscordAPI or
	// FluxerAPI.
	API string
	// GatewayURL, when set, is used instead of discovery. Its query, if
	// any, is ignored, as is that of a discovered or resume URL: version,
	// encoding and compression come from Flavor and Compression.
	GatewayURL  string
	Compression Compression
	// Sink receives dispatches; nil drops them.
	Sink Sink
	// OnStartLimit receives Discord's session_start_limit after each
	// discovery; the binary passes (*core.Pacer).SetStartLimit. The figure
	// may lag the identifies in flight (a connection discovers after its
	// slot was granted), so the pacer only ever lowers its count from it.
	// It is never called for Fluxer, whose figures are constants.
	OnStartLimit func(core.StartLimit)
	// OnSession, when set, receives each new session (READY) of a shard
	// and its first sequence, before the core hears of it; a supervised
	// child hands it to its parent, which resumes the session if the
	// child crashes. The session ID is a secret.
	OnSession func(shard int, s core.Session, seq int64)

	// Clock drives heartbeats and the Hello and READY timeouts; nil means
	// real time. Network deadlines (dial, TLS, writes) use real time.
	Clock clock.Clock
	// Rand returns uniform values in [0, 1) for the first heartbeat's
	// jitter; nil means math/rand/v2.
	Rand   func() float64
	Logger *slog.Logger

	HTTPClient *http.Client
	TLSConfig  *tls.Config
	// HandshakeTimeout bounds TCP connect, TLS and the WebSocket upgrade
	// (default 30 s, real time).
	HandshakeTimeout time.Duration
	// HelloTimeout bounds the wait for Hello after the upgrade (default
	// 20 s); ReadyTimeout the wait for READY or RESUMED after identify or
	// resume, counted from the last dispatch so that a long replay does not
	// time out (default 60 s).
	HelloTimeout, ReadyTimeout time.Duration
	// DiscoveryMaxAge is how long a discovered URL is reused (default 1 h;
	// Discord asks not to cache it for long). A failed connection drops it
	// sooner.
	DiscoveryMaxAge time.Duration
	// IdentifyMargin is added to Discord's 5 s identify window between two
	// identifies of one bucket, counted from their writes (default
	// DefaultIdentifyMargin). Negative turns that spacing off: identifies
	// then go out as soon as the core's pacer grants them. See
	// identifyGate.
	IdentifyMargin time.Duration
	// ShareIdentifyGate, when set, is a transport of the same bot whose
	// spacing of identifies this one shares, so that two plans run side
	// by side (a move to a larger plan) never send two identifies of one
	// bucket closer than the window. The gate lives until both are closed.
	ShareIdentifyGate *Transport
	// IdentifyNotBefore, when set, gives the earliest moment a Discord
	// identify of shard may be written; the gate holds the identify until then, on
	// top of its own spacing (also with that spacing off). A supervised
	// child passes the floor its parent's grant carried: the parent spaces
	// a bucket's identifies across children from their writes. The time
	// is read on Clock (real time: the wall clock the processes share).
	IdentifyNotBefore func(shard int) time.Time
	// IdentifyWritten, when set, receives the moment (on Clock) each
	// Discord identify was written, once the write returned; a supervised child
	// reports it to its parent. It runs on the connection's goroutine:
	// keep it short.
	// With ShareIdentifyGate, both hooks are those of the transport that
	// made the gate.
	IdentifyWritten func(shard int, at time.Time)
}

// Format hides the token from every fmt verb.
func (c Config) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "gateway.Config{Flavor:%v Token:redacted Intents:%d Compression:%q GatewayURL:%q}", c.Flavor, c.Intents, c.Compression, c.GatewayURL)
}

// LogValue hides the token from slog.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("flavor", c.Flavor.String()), slog.String("compression", string(c.Compression)), slog.String("token", "redacted"))
}

// Transport opens gateway connections for a core.Scheduler. It implements
// core.Transport.
type Transport struct {
	cfg       Config
	ownClient bool // cfg.HTTPClient is ours to close
	clock     clock.Clock
	log       *slog.Logger
	token     string // without the HTTP prefix
	query     url.Values
	dialer    net.Dialer
	pool      writePool
	names     internTable
	gate      *identifyGate
	idler     *idler
	// onPhase, when set (by tests), sees every phase move, under the
	// connection's mu.
	onPhase func(c *conn, from, to phase)

	// life admits the goroutines and timer callbacks Close waits for;
	// its lock is taken last.
	life lifetime

	mu      sync.Mutex
	conns   map[*conn]struct{}
	records map[int]*shardRecord

	// dialMu guards the connections dialling now and those waiting for
	// their turn (see maxDialing).
	dialMu  sync.Mutex
	dialing int
	dialQ   []*conn

	dmu         sync.Mutex
	url         string
	urlAt       time.Time
	discovering chan struct{}
	discoverErr error
	// trusted is the last discovered URL, kept when url is dropped: the
	// gateway whose domain a resume may go to (see checkResume).
	trusted string
	refused map[string]struct{} // resume hosts refused and logged
}

var _ core.Transport = (*Transport)(nil)

// New returns a Transport for cfg.
func New(cfg Config) (*Transport, error) {
	if bareToken(cfg.Token) == "" {
		return nil, errors.New("gateway: Config.Token is empty")
	}
	switch cfg.Compression {
	case NoCompression, ZstdStream:
	case ZlibStream:
		if cfg.Flavor == core.Fluxer {
			return nil, errors.New("gateway: Fluxer offers zstd-stream only")
		}
	default:
		return nil, fmt.Errorf("gateway: unknown compression %q", cfg.Compression)
	}
	if cfg.GatewayURL != "" {
		if _, err := wsURL(cfg.GatewayURL); err != nil {
			return nil, err
		}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ownClient := cfg.HTTPClient == nil
	if ownClient {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	cfg.HandshakeTimeout = orDuration(cfg.HandshakeTimeout, 30*time.Second)
	cfg.HelloTimeout = orDuration(cfg.HelloTimeout, 20*time.Second)
	cfg.ReadyTimeout = orDuration(cfg.ReadyTimeout, 60*time.Second)
	cfg.DiscoveryMaxAge = orDuration(cfg.DiscoveryMaxAge, time.Hour)
	if cfg.IdentifyMargin == 0 {
		cfg.IdentifyMargin = DefaultIdentifyMargin
	}
	q := url.Values{}
	q.Set("encoding", "json")
	if cfg.Flavor == core.Fluxer {
		q.Set("v", "1")
		if cfg.Compression == ZstdStream {
			q.Set("compress", "zstd-stream")
			q.Set("stream", "1")
		}
	} else {
		q.Set("v", "10")
		if cfg.Compression != NoCompression {
			q.Set("compress", string(cfg.Compression))
		}
	}
	t := &Transport{
		ownClient: ownClient,
		cfg:       cfg,
		clock:     clock.Or(cfg.Clock),
		log:       cfg.Logger,
		token:     bareToken(cfg.Token),
		query:     q,
		dialer:    net.Dialer{KeepAlive: 30 * time.Second},
		conns:     make(map[*conn]struct{}),
	}
	if cfg.ShareIdentifyGate != nil {
		t.gate = cfg.ShareIdentifyGate.gate.share()
	} else {
		t.gate = newIdentifyGate(cfg.Clock, cfg.IdentifyMargin)
		t.gate.notBefore, t.gate.written = cfg.IdentifyNotBefore, cfg.IdentifyWritten
	}
	t.names.init()
	t.idler = newIdler(t)
	return t, nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Connect implements core.Transport: it starts the connection's reader and
// returns at once. The reader does discovery, dialling, Hello and identify
// or resume, and reports every outcome through l.
func (t *Transport) Connect(l *core.Link, a core.Attempt) core.Conn {
	c := newConn(t, l, a)
	if !t.track(c) {
		c.mu.Lock()
		c.endLocked() // closed transport: a connection that never opens
		c.mu.Unlock()
		c.markEnded()
		return c
	}
	t.dialMu.Lock()
	if t.dialing >= maxDialing {
		t.dialQ = append(t.dialQ, c)
		t.dialMu.Unlock()
		return c
	}
	t.dialing++
	t.dialMu.Unlock()
	t.start(c)
	return c
}

// maxDialing bounds the connections that dial, upgrade and wait for the
// gateway at once; the others wait in order, with no goroutine. When every
// bucket may identify at once (a large max_concurrency, a resume of every
// shard after an outage), thousands of sockets would otherwise open in the
// same instant, each with a goroutine and its buffers; the runtime never
// frees a goroutine's descriptor, so that instant's peak would stay in the
// node's memory for good. A dial takes milliseconds, so the queue drains
// in a blink.
const maxDialing = 64

// start runs a connection's reader; it holds a dialling slot, which it
// gives back through dialDone.
func (t *Transport) start(c *conn) {
	for c != nil {
		if t.life.Go(c.run) {
			return
		}
		// A closed transport starts nothing: the connection never opens.
		c.mu.Lock()
		c.endLocked()
		c.mu.Unlock()
		t.untrack(c)
		c.markEnded()
		c = t.nextDial()
	}
}

// dialDone gives a dialling slot back, to the next waiting connection if
// there is one.
func (t *Transport) dialDone() { t.start(t.nextDial()) }

// nextDial hands the slot of a connection that finished dialling to the
// next one waiting, or frees it.
func (t *Transport) nextDial() *conn {
	t.dialMu.Lock()
	defer t.dialMu.Unlock()
	if len(t.dialQ) == 0 {
		t.dialing--
		return nil
	}
	c := t.dialQ[0]
	t.dialQ[0] = nil
	t.dialQ = t.dialQ[1:]
	return c
}

// Close closes every connection with 4000, so that sessions stay
// resumable, and waits for every goroutine the transport started. Close
// the core.Scheduler first; connections asked for afterwards never open.
func (t *Transport) Close() error {
	if !t.life.close() {
		return nil
	}
	t.mu.Lock()
	conns := make([]*conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.Close(4000)
	}
	t.idler.close()
	t.gate.stop()
	t.life.wait()
	if t.ownClient {
		t.cfg.HTTPClient.CloseIdleConnections()
	}
	return nil
}

func (t *Transport) track(c *conn) bool {
	if t.life.isClosed() {
		return false
	}
	t.mu.Lock()
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	return true
}

func (t *Transport) untrack(c *conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// wsURL checks a gateway URL and returns it parsed.
func wsURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "ws" && u.Scheme != "wss" || u.Host == "" {
		return nil, fmt.Errorf("gateway: %q is not a ws:// or wss:// URL", s)
	}
	if u.Scheme == "ws" && !plainOK(u.Hostname()) {
		return nil, fmt.Errorf("gateway: refusing to send the token unencrypted to %s; use wss://", u.Host)
	}
	return u, nil
}

// plainOK reports whether an unencrypted connection may carry the token:
// only to this machine (the simulator, a local proxy).
func plainOK(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// connectURL is the URL to dial for a gateway or resume URL: its scheme,
// host and path, with the flavor's query (version, encoding, compression)
// and nothing else. A query in the URL itself, a resume_gateway_url's
// compress= above all, must not override the configuration: the
// connection would then be compressed or versioned unlike what the client
// reads, and every resume would fail.
func (t *Transport) connectURL(base string) (string, error) {
	u, err := wsURL(base)
	if err != nil {
		return "", err
	}
	target := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: t.query.Encode()}
	if target.Path == "" {
		target.Path = "/"
	}
	return target.String(), nil
}

// writePool lends gorilla a write buffer only while a message is being
// written, instead of 4 KiB per connection for its whole life.
type writePool struct{ p sync.Pool }

func (w *writePool) Get() any  { return w.p.Get() }
func (w *writePool) Put(v any) { w.p.Put(v) }

// Payload buffers: taken when a message arrives, returned after the sink
// saw it, so that idle connections hold none.
var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 2048)
	return &b
}}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // a rare large message: let the collector have it
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// internTable maps event names to shared strings, so that handing a name
// to the sink allocates nothing. Lookups are lock-free; the table is
// copied on the rare insert and bounded.
type internTable struct {
	m  atomic.Pointer[map[string]string]
	mu sync.Mutex
}

const maxInterned = 1024

var commonNames = []string{
	"READY", "RESUMED", "MESSAGE_CREATE", "MESSAGE_UPDATE", "MESSAGE_DELETE",
	"GUILD_CREATE", "GUILD_UPDATE", "GUILD_DELETE", "GUILD_MEMBER_ADD",
	"GUILD_MEMBER_UPDATE", "GUILD_MEMBER_REMOVE", "GUILD_MEMBERS_CHUNK",
	"PRESENCE_UPDATE", "TYPING_START", "MESSAGE_REACTION_ADD",
	"MESSAGE_REACTION_REMOVE", "VOICE_STATE_UPDATE", "INTERACTION_CREATE",
	"CHANNEL_CREATE", "CHANNEL_UPDATE", "CHANNEL_DELETE", "THREAD_CREATE",
}

func (n *internTable) init() {
	m := make(map[string]string, len(commonNames))
	for _, s := range commonNames {
		m[s] = s
	}
	n.m.Store(&m)
}

func (n *internTable) get(b []byte) string {
	if s, ok := (*n.m.Load())[string(b)]; ok {
		return s
	}
	s := string(b)
	if !plainName(b) {
		return s
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.m.Load()
	if len(old) >= maxInterned {
		return s
	}
	m := make(map[string]string, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[s] = s
	n.m.Store(&m)
	return s
}

// plainName accepts the names dispatches use, so that garbage names from a
// broken server do not fill the table.
func plainName(b []byte) bool {
	if len(b) == 0 || len(b) > 64 {
		return false
	}
	for _, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
