package gatewaysim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/shardfs/shardfs/clock"
)

// Flavor selects the platform whose gateway the simulator speaks.
type Flavor int

const (
	// Discord is Discord's gateway API v10.
	Discord Flavor = iota
	// Fluxer is Fluxer's gateway API v1.
	Fluxer
)

func (f Flavor) String() string {
	if f == Fluxer {
		return "fluxer"
	}
	return "discord"
}

// Config describes the simulated platform and the bot it serves. The zero
// value is a Discord gateway for a one-shard bot with the platform's limits;
// every zero field takes the flavor's default.
type Config struct {
	Flavor Flavor

	// Addr is the TCP address to listen on; empty means 127.0.0.1:0.
	Addr string
	// Listener, when set, is served instead of listening on Addr. Close
	// closes it.
	Listener net.Listener
	// TLS, when set, serves discovery and the gateway over TLS, as the
	// real platforms do: the URLs say https:// and wss://.
	TLS *tls.Config

	// Token is the bot token identify, resume and discovery must present
	// (without the "Bot " prefix); empty means "sim-token".
	Token string
	// Shards is the shard count discovery recommends (Discord; Fluxer always
	// reports 1); default 1.
	Shards int
	// ShardingRequired makes identify close 4010 unless its total equals
	// Shards, like Discord's large-bot sharding.
	ShardingRequired bool
	// Guilds is how many guilds the bot is in; default Shards. Guild k has
	// the snowflake GuildID(k); a shard with more than 2,500 of them closes
	// 4011 on identify.
	Guilds int
	// DeniedIntents are the privileged intents not enabled for this bot
	// (Discord); identifying with one closes 4014.
	DeniedIntents uint64

	// MaxConcurrency is Discord's identify concurrency; default 1.
	MaxConcurrency int
	// IdentifyInterval is how long a Discord identify bucket stays taken;
	// default 5 s.
	IdentifyInterval time.Duration
	// IdentifyTolerance accepts an identify that comes up to this much
	// before its bucket's IdentifyInterval has passed; default 0, strict.
	// A test whose clients are other processes on a loaded machine sets
	// it: the simulator times an identify when its goroutine reads it,
	// and two clients' frames read late by different amounts turn a
	// 5.05 s spacing at the writers into under 5 s at the simulator.
	IdentifyTolerance time.Duration
	// SessionStartLimit is Discord's daily identify allowance; default 1000.
	// Identifying when none remains revokes the token, as Discord does.
	SessionStartLimit int
	// SessionStartUsed is how much of the allowance is already used at start.
	SessionStartUsed int
	// SessionStartReset is how long the allowance lasts; default 24 h.
	SessionStartReset time.Duration
	// IdentifyBudget is Fluxer's identify budget per IdentifyBudgetWindow;
	// default 300 per 60 s. Excess identifies are dropped without answer.
	IdentifyBudget       int
	IdentifyBudgetWindow time.Duration

	// HeartbeatInterval is sent in Hello; default 41.25 s.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout closes a connection 4009 when no heartbeat arrives in
	// time; default interval×1.5 (Discord) or 45 s scaled with the interval
	// (Fluxer).
	HeartbeatTimeout time.Duration
	// QuietAfter, when positive, takes a session out of LiveSessions while
	// its connection has sent nothing for that long; the connection stays
	// open (until HeartbeatTimeout), and the next frame on it counts the
	// session live again, in MaxLiveSessions too. A paused client's
	// sockets so stay open, as at Discord, without counting as a second
	// session, while a woken client writing on one does. Zero: a session
	// is live while attached.
	QuietAfter time.Duration
	// HeartbeatRequestAfter makes the server send op 1 after that long
	// without a heartbeat; default never (Discord) or 0.9×interval (Fluxer);
	// negative means never.
	HeartbeatRequestAfter time.Duration

	// ResumeWindow is how long a disconnected session stays resumable;
	// default 3 min (Discord) or 60 s (Fluxer).
	ResumeWindow time.Duration
	// ReplayLimit bounds the dispatches retained per session; default 1024.
	ReplayLimit int
	// UnretainedEvery makes every Nth published event unretained for replay
	// (Fluxer only), so that resumes see sequence gaps.
	UnretainedEvery int
	// UnretainedEvents are dispatch names never retained (Fluxer only).
	UnretainedEvents []string

	// SendLimit commands per SendWindow per connection, heartbeats included;
	// one more closes 4008. Default 120 (Discord) or 500 (Fluxer) per 60 s.
	SendLimit  int
	SendWindow time.Duration

	// ReconnectGrace is how long a connection told to reconnect (op 7) stays
	// open before the server closes it 4000; default 30 s.
	ReconnectGrace time.Duration
	// MaxQueuedFrames drops a connection abruptly when that many frames wait
	// for a slow reader; default 16384.
	MaxQueuedFrames int

	// Traffic is the initial event traffic (see SetTraffic).
	Traffic Traffic
	// Seed seeds the traffic generator; zero means a fixed seed.
	Seed uint64

	// OnFrame, when set, is called with every message a client sends, its
	// close frame included, after the server has handled it and from the
	// connection's reader goroutine (so one connection's frames arrive in
	// order and a slow OnFrame slows that client alone). It lets a test see
	// who sent what when, e.g. that a node sent nothing for a shard it no
	// longer owned.
	OnFrame func(Frame)

	// Clock drives every timer of the simulator; nil means real time.
	Clock clock.Clock
	// Logger receives connection events; nil discards them. Tokens and
	// session ids are never logged.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Token == "" {
		c.Token = "sim-token"
	}
	if c.Shards <= 0 {
		c.Shards = 1
	}
	if c.Guilds <= 0 {
		c.Guilds = c.Shards
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = 1
	}
	if c.IdentifyInterval <= 0 {
		c.IdentifyInterval = 5 * time.Second
	}
	if c.SessionStartLimit <= 0 {
		c.SessionStartLimit = 1000
	}
	if c.SessionStartReset <= 0 {
		c.SessionStartReset = 24 * time.Hour
	}
	if c.IdentifyBudget <= 0 {
		c.IdentifyBudget = 300
	}
	if c.IdentifyBudgetWindow <= 0 {
		c.IdentifyBudgetWindow = 60 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 41250 * time.Millisecond
	}
	if c.HeartbeatTimeout <= 0 {
		if c.Flavor == Fluxer {
			// 45 s for the 41.25 s interval Fluxer advertises.
			c.HeartbeatTimeout = c.HeartbeatInterval * 12 / 11
		} else {
			c.HeartbeatTimeout = c.HeartbeatInterval * 3 / 2
		}
	}
	if c.HeartbeatRequestAfter == 0 && c.Flavor == Fluxer {
		// Fluxer asks at 37.125 s of its 41.25 s interval.
		c.HeartbeatRequestAfter = c.HeartbeatInterval * 9 / 10
	}
	if c.HeartbeatRequestAfter >= c.HeartbeatTimeout {
		c.HeartbeatRequestAfter = -1
	}
	if c.ResumeWindow <= 0 {
		if c.Flavor == Fluxer {
			c.ResumeWindow = 60 * time.Second
		} else {
			c.ResumeWindow = 3 * time.Minute
		}
	}
	if c.ReplayLimit <= 0 {
		c.ReplayLimit = 1024
	}
	if c.SendLimit <= 0 {
		if c.Flavor == Fluxer {
			c.SendLimit = 500
		} else {
			c.SendLimit = 120
		}
	}
	if c.SendWindow <= 0 {
		c.SendWindow = 60 * time.Second
	}
	if c.ReconnectGrace <= 0 {
		c.ReconnectGrace = 30 * time.Second
	}
	if c.MaxQueuedFrames <= 0 {
		c.MaxQueuedFrames = 16384
	}
	if c.Flavor != Fluxer {
		c.UnretainedEvery = 0
		c.UnretainedEvents = nil
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Server is a running simulated gateway: an HTTP discovery endpoint and a
// WebSocket gateway on one listener.
type Server struct {
	cfg      Config
	clock    clock.Clock
	log      *slog.Logger
	ln       net.Listener
	http     *http.Server
	upgrader websocket.Upgrader
	base     string // host:port
	// resumeURL, when set, replaces READY's resume_gateway_url.
	resumeURL atomic.Pointer[string]
	// guilds and recommended start as Config.Guilds and Config.Shards; SetGuilds
	// and SetShards change them while the server runs (a bot that grows).
	guilds, recommended atomic.Int64
	// guildPages is the fault of the guild list (see SetGuildListFault).
	guildPages atomic.Pointer[GuildListFault]

	// lifeMu guards closed; it is taken last, so that goroutines and timer
	// callbacks can be admitted from under any other lock.
	lifeMu sync.Mutex
	closed bool
	wg     sync.WaitGroup
	served chan struct{}

	mu           sync.Mutex
	token        string
	tokenRevoked bool
	conns        map[*conn]struct{}
	sessions     map[string]*session
	shards       map[int]*shard
	shardList    []*shard          // in creation order, so that traffic is generated in a stable order
	buckets      map[int]time.Time // Discord identify bucket → last identify
	startBegin   time.Time         // Discord session start window
	startUsed    int
	identifyLog  []time.Time // Fluxer identify budget, oldest first
	published    int64       // events published, for UnretainedEvery
	unretained   map[string]bool
	allFaults    stickyFaults // faults injected for all shards
	rng          *rand.Rand
	nextID       uint64
	connSeq      atomic.Uint64 // numbers connections for Frame
	traffic      trafficState
	sweepTimer   clock.Timer
	stats        serverCounters
	changes      broadcast
}

// Frame is one message a client sent, as Config.OnFrame sees it. Neither
// the token nor the session id is in it.
type Frame struct {
	Conn   uint64 // the connection's number, from 1 in accept order
	Remote string // the client's address, host:port
	// Shard is the shard the frame was about when it arrived: that of the
	// connection's session, else the one an identify names or whose
	// session a resume names; -1 when none is known (a heartbeat before
	// identify, a resume of an unknown session).
	Shard int
	// Total is the shard count of the connection's session, set on an
	// OpClose frame (0 when the connection had no session): two plans of
	// one bot have sessions of one shard id with different totals.
	Total int
	Op    int // the opcode; -1 for a payload that did not decode, OpClose for a close frame
	Code  int // the close code of an OpClose frame (0: none)
	// Reply marks an OpClose that answers the server's own close (the
	// closing handshake), not one the client started.
	Reply bool
	At    time.Time // receipt, on Config.Clock
}

// OpClose is the Op of a Frame that is the client's WebSocket close.
const OpClose = -2

// AllShards makes Inject and ClearFaults apply to every connection.
const AllShards = -1

// New starts a simulated gateway described by cfg.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	ln := cfg.Listener
	if ln == nil {
		addr := cfg.Addr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("gatewaysim: listen: %w", err)
		}
	}
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
	}
	s := &Server{
		cfg:      cfg,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		ln:       ln,
		base:     ln.Addr().String(),
		served:   make(chan struct{}),
		token:    cfg.Token,
		conns:    make(map[*conn]struct{}),
		sessions: make(map[string]*session),
		shards:   make(map[int]*shard),
		buckets:  make(map[int]time.Time),
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x5ead)),
	}
	if len(cfg.UnretainedEvents) > 0 {
		s.unretained = make(map[string]bool)
		for _, n := range cfg.UnretainedEvents {
			s.unretained[n] = true
		}
	}
	s.startUsed = cfg.SessionStartUsed
	if s.startUsed > 0 {
		s.startBegin = s.clock.Now()
	}
	s.upgrader = websocket.Upgrader{
		ReadBufferSize:  512,
		WriteBufferPool: &sync.Pool{},
		CheckOrigin:     func(*http.Request) bool { return true },
	}
	mux := http.NewServeMux()
	if cfg.Flavor == Fluxer {
		mux.HandleFunc("GET /api/v1/gateway/bot", s.authenticated(s.serveGatewayBot))
		mux.HandleFunc("GET /v1/gateway/bot", s.authenticated(s.serveGatewayBot))
		mux.HandleFunc("GET /api/v1/users/@me/guilds", s.authenticated(s.serveGuildList))
		mux.HandleFunc("GET /v1/users/@me/guilds", s.authenticated(s.serveGuildList))
	} else {
		mux.HandleFunc("GET /api/v10/gateway/bot", s.authenticated(s.serveGatewayBot))
		mux.HandleFunc("GET /api/v10/gateway", s.serveGateway)
		mux.HandleFunc("GET /api/v10/users/@me/guilds", s.authenticated(s.serveGuildList))
	}
	mux.HandleFunc("/", s.serveWebSocket)
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(s.served)
		_ = s.http.Serve(ln)
	}()
	s.guilds.Store(int64(cfg.Guilds))
	s.recommended.Store(int64(cfg.Shards))
	s.SetTraffic(cfg.Traffic)
	return s, nil
}

// APIURL is the HTTP API base: http://HOST/api/v10 or http://HOST/api/v1.
func (s *Server) APIURL() string {
	if s.cfg.Flavor == Fluxer {
		return s.scheme("http") + s.base + "/api/v1"
	}
	return s.scheme("http") + s.base + "/api/v10"
}

// GatewayURL is the gateway URL discovery returns, without query: Discord's
// ends in a slash like wss://gateway.discord.gg/, Fluxer's does not.
func (s *Server) GatewayURL() string {
	if s.cfg.Flavor == Fluxer {
		return s.scheme("ws") + s.base
	}
	return s.scheme("ws") + s.base + "/"
}

// ResumeURL is the resume_gateway_url READY carries (Discord); Fluxer
// resumes on GatewayURL.
func (s *Server) ResumeURL() string {
	if s.cfg.Flavor == Fluxer {
		return s.GatewayURL()
	}
	if u := s.resumeURL.Load(); u != nil {
		return *u
	}
	return s.scheme("ws") + s.base + "/resume"
}

// scheme is plain's URL prefix, with an s over TLS.
func (s *Server) scheme(plain string) string {
	if s.cfg.TLS != nil {
		return plain + "s://"
	}
	return plain + "://"
}

// SetResumeURL makes later READYs (Discord) carry u as resume_gateway_url,
// whatever host or query it names, as a misconfigured or hostile gateway
// might; "" restores the default.
func (s *Server) SetResumeURL(u string) {
	if u == "" {
		s.resumeURL.Store(nil)
		return
	}
	s.resumeURL.Store(&u)
}

// Addr is the listener's address.
func (s *Server) Addr() string { return s.base }

// Flavor is the platform the server simulates.
func (s *Server) Flavor() Flavor { return s.cfg.Flavor }

// Config returns the configuration in effect, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// SetToken replaces the accepted token and lifts a revocation caused by an
// exhausted session start limit.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
	s.tokenRevoked = false
	s.startUsed = 0
	s.startBegin = time.Time{}
}

// Close stops the server: it closes every connection with 1001, stops every
// timer and waits for every goroutine it started.
func (s *Server) Close() error {
	s.lifeMu.Lock()
	if s.closed {
		s.lifeMu.Unlock()
		return nil
	}
	s.closed = true
	s.lifeMu.Unlock()

	err := s.http.Close()
	<-s.served

	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	for _, sess := range s.sessions {
		if sess.expiry != nil {
			sess.expiry.Stop()
		}
	}
	if s.traffic.timer != nil {
		s.traffic.timer.Stop()
	}
	if s.sweepTimer != nil {
		s.sweepTimer.Stop()
	}
	for c := range s.conns {
		if c.hb != nil {
			c.hb.Stop()
		}
		if c.quietT != nil {
			c.quietT.Stop()
		}
	}
	s.mu.Unlock()

	// One deadline for all: a client that stopped reading must not hold up
	// the others.
	deadline := time.Now().Add(200 * time.Millisecond)
	for _, c := range conns {
		c.goingAway(deadline)
		c.shutdown()
	}
	s.wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// enter admits a goroutine or timer callback unless the server is closed.
func (s *Server) enter() bool {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// spawn runs f in a goroutine that Close waits for.
func (s *Server) spawn(f func()) bool {
	if !s.enter() {
		return false
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// after runs f after d on the injected clock, unless the server has closed.
func (s *Server) after(d time.Duration, f func()) clock.Timer {
	return s.clock.AfterFunc(d, func() {
		if !s.enter() {
			return
		}
		defer s.wg.Done()
		f()
	})
}

func (s *Server) authorized(r *http.Request) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.tokenRevoked && r.Header.Get("Authorization") == "Bot "+s.token
}

// authenticated wraps an endpoint of the bot's HTTP API: it answers 503
// once the server is closing and 401 without the bot's token, and sets
// the JSON content type.
func (s *Server) authenticated(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			http.Error(w, "closed", http.StatusServiceUnavailable)
			return
		}
		defer s.wg.Done()
		w.Header().Set("Content-Type", "application/json")
		if !s.authorized(r) {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"message": "401: Unauthorized", "code": 0}`)
			return
		}
		f(w, r)
	}
}

// serveGatewayBot answers GET {api}/gateway/bot.
func (s *Server) serveGatewayBot(w http.ResponseWriter, r *http.Request) {
	type limit struct {
		Total          int   `json:"total"`
		Remaining      int   `json:"remaining"`
		ResetAfter     int64 `json:"reset_after"`
		MaxConcurrency int   `json:"max_concurrency"`
	}
	var body struct {
		URL               string `json:"url"`
		Shards            int    `json:"shards"`
		SessionStartLimit limit  `json:"session_start_limit"`
	}
	body.URL = s.GatewayURL()
	if s.cfg.Flavor == Fluxer {
		// Fluxer documents every member as a constant.
		body.Shards = 1
		body.SessionStartLimit = limit{Total: 1000, Remaining: 999, ResetAfter: 14400000, MaxConcurrency: 1}
	} else {
		s.mu.Lock()
		now := s.clock.Now()
		s.refreshStartLimit(now)
		reset := s.cfg.SessionStartReset
		if !s.startBegin.IsZero() {
			reset = s.startBegin.Add(s.cfg.SessionStartReset).Sub(now)
		}
		body.Shards = int(s.recommended.Load())
		body.SessionStartLimit = limit{
			Total:          s.cfg.SessionStartLimit,
			Remaining:      max(0, s.cfg.SessionStartLimit-s.startUsed),
			ResetAfter:     reset.Milliseconds(),
			MaxConcurrency: s.cfg.MaxConcurrency,
		}
		s.mu.Unlock()
	}
	_ = json.NewEncoder(w).Encode(body)
}

// serveGateway answers Discord's unauthenticated GET {api}/gateway.
func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"url": s.GatewayURL()})
}

// refreshStartLimit starts a new Discord session start window when the old
// one has run out. s.mu must be held.
func (s *Server) refreshStartLimit(now time.Time) {
	if !s.startBegin.IsZero() && !now.Before(s.startBegin.Add(s.cfg.SessionStartReset)) {
		s.startBegin = time.Time{}
		s.startUsed = 0
	}
}

// serveWebSocket upgrades a gateway connection and runs its reader.
func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	path := strings.Trim(r.URL.Path, "/")
	viaResume := path == "resume"
	if path != "" && !viaResume {
		http.NotFound(w, r)
		return
	}
	if !s.enter() {
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	defer s.wg.Done()
	q := r.URL.Query()
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	c := newConn(s, ws, viaResume)
	code, reason := c.negotiate(q.Get("v"), q.Get("encoding"), q.Get("compress"), q.Get("stream"))
	if !s.register(c) {
		_ = ws.Close()
		return
	}
	if code != 0 {
		s.mu.Lock()
		c.closeLocked(code, reason)
		s.mu.Unlock()
	} else {
		c.hello()
	}
	// Read in a goroutine of our own and let the HTTP server's goroutine
	// end: it would otherwise keep its 8 KB of buffers for the life of the
	// connection.
	if !s.spawn(c.serve) {
		c.shutdown()
	}
}

// register adds c to the live connections unless the server is closing.
func (s *Server) register(c *conn) bool {
	s.lifeMu.Lock()
	closed := s.closed
	s.lifeMu.Unlock()
	if closed {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[c] = struct{}{}
	s.stats.connections++
	return true
}

// Connections is the number of open WebSocket connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Accepted is the number of WebSocket connections accepted since New, so
// that a test can count a client's reconnects.
func (s *Server) Accepted() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.connections
}

// Wait blocks until cond holds or ctx ends. cond is evaluated again after
// every change of the server's state, so a test waits at the network
// boundary without sleeping or polling; cond may call the server's methods.
func (s *Server) Wait(ctx context.Context, cond func() bool) error {
	for {
		changed := s.changes.wait()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// broadcast wakes every waiter when the server's state changes.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
