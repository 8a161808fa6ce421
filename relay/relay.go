package relay

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// Config configures a Server. Token, Total, Journal and Send are required.
type Config struct {
	// Token is the bot's token: a client's identify and resume must carry
	// it. It is compared in constant time and never logged.
	Token string
	// Flavor is the node's gateway flavor, the one the relay speaks to its
	// clients (DESIGN.md section 3): Discord v10 or Fluxer v1.
	Flavor core.Flavor
	// Intents are the node's own: a client gets at most these (Discord).
	Intents uint64
	// Total is the plan's total; Shards the shards whose journals the relay
	// serves (a client's identify for another closes 4010).
	Total  int
	Shards []int
	// Journal returns a shard's dispatch journal.
	Journal func(shard int) *journal.Log
	// Send passes a client's op 3, 4 or 8 to the shard's paced send path
	// (core.Scheduler.Send); an error refuses it.
	Send func(shard int, payload []byte) error
	// ResumeWindow is how long a client's session stays resumable after
	// its connection ends (default 60 s).
	ResumeWindow time.Duration
	// Cache are the cache kinds (default DefaultKinds), CacheBytes its
	// bound across shards (default 256 MiB).
	Cache      []string
	CacheBytes int64
	// API, when set, is the HTTP API every request under /api/ other than
	// gateway discovery is forwarded to, unchanged (e.g.
	// https://discord.com/api). Empty answers those 404.
	API string
	// MaxConns caps the WebSocket connections served at once (default
	// 4,096); one more is refused with 503 before the upgrade.
	MaxConns int
	// State, when set, is what Save wrote at the previous process's clean
	// stop: the cache, a tail of each shard's dispatches and the client
	// sessions, so that clients resume across the restart. A state that
	// does not fit (another total) is refused with an error.
	State io.Reader
	// Events receives a line for every client connect, identify, resume,
	// kick and close (the node's /events).
	Events *journal.Log
	Clock  clock.Clock
	Logger *slog.Logger
}

// Server is a running relay.
type Server struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
	plan  atomic.Pointer[servedPlan] // set under mu
	bytes *cacheBytes
	kinds map[string]bool
	proxy *httputil.ReverseProxy
	done  chan struct{}
	wg    sync.WaitGroup // the journal followers
	// handlers are the client connections' handlers, which http.Server
	// does not wait for once they took the connection over.
	handlers sync.WaitGroup

	mu        sync.Mutex
	sessions  map[string]*session // by session id
	clients   map[int]*session    // by client id
	nextID    int
	conns     map[*conn]struct{}
	upgrading int // connections counted before their upgrade
	listeners []net.Listener
	servers   []*http.Server
	closed    bool
	nonces    map[string]nonceOwner // relay nonce → who asked
	nonceSeq  uint64
	voice     map[string]*session // guild id → the client of the last op 4
}

type nonceOwner struct {
	sess  *session
	nonce json.RawMessage // the client's own, or nil
}

// New makes a relay and starts following the shards' journals.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" || cfg.Journal == nil || cfg.Send == nil || cfg.Total < 1 {
		return nil, errors.New("relay: Token, Total, Journal and Send are required")
	}
	if cfg.ResumeWindow <= 0 {
		cfg.ResumeWindow = 60 * time.Second
	}
	if cfg.Cache == nil {
		cfg.Cache = DefaultKinds
	}
	kinds := map[string]bool{}
	for _, k := range cfg.Cache {
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("relay: unknown cache kind %q (kinds: %s)", k, strings.Join(Kinds, ","))
		}
		kinds[k] = true
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 4096
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = 256 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, clock: clock.Or(cfg.Clock),
		bytes: newCacheBytes(cfg.CacheBytes), kinds: kinds, done: make(chan struct{}),
		sessions: map[string]*session{}, clients: map[int]*session{}, conns: map[*conn]struct{}{},
		nonces: map[string]nonceOwner{}, voice: map[string]*session{}}
	if cfg.API != "" {
		u, err := url.Parse(cfg.API)
		if err != nil {
			return nil, fmt.Errorf("relay: API: %w", err)
		}
		s.proxy = newProxy(u, log)
	}
	p, err := s.newPlan(cfg.Total, cfg.Shards, cfg.Journal, cfg.Send)
	if err != nil {
		return nil, err
	}
	s.plan.Store(p)
	if cfg.State != nil {
		if err := s.load(cfg.State); err != nil {
			return nil, err
		}
	}
	s.follow(p)
	return s, nil
}

// servedPlan is the plan whose shards the relay serves: the node's
// first, and after a move to a larger plan (Replan) the new one.
type servedPlan struct {
	total  int
	ids    []int
	shards map[int]*shardCache
	send   func(shard int, payload []byte) error
	stop   chan struct{} // closed when the relay stops following it
	// followers are its journal followers (also in Server.wg), waited
	// for before its cache's bytes are given back.
	followers sync.WaitGroup
}

func (s *Server) newPlan(total int, ids []int, journal func(int) *journal.Log, send func(int, []byte) error) (*servedPlan, error) {
	p := &servedPlan{total: total, ids: ids, shards: map[int]*shardCache{}, send: send, stop: make(chan struct{})}
	for _, id := range ids {
		l := journal(id)
		if l == nil {
			return nil, fmt.Errorf("relay: shard %d has no dispatch journal", id)
		}
		p.shards[id] = newShardCache(id, l, s.kinds, s.bytes)
	}
	return p, nil
}

// follow starts p's journal followers.
func (s *Server) follow(p *servedPlan) {
	for _, c := range p.shards {
		p.followers.Add(1)
		s.wg.Go(func() {
			defer p.followers.Done()
			c.follow(p.stop)
		})
	}
}

// current is the plan the relay serves now.
func (s *Server) current() *servedPlan { return s.plan.Load() }

// Replan makes the relay serve the plan a node has moved to (a reshard,
// DESIGN.md section 7.5), once the node's tree shows it: total, its
// shards, their dispatch journals and send path. The clients of the old
// plan are closed 4011 "Sharding required." with their sessions ended, as
// the gateway closes a shard that has outgrown its plan: a library (or
// the process manager around it) that reshards on 4011 asks discovery
// again, which now answers the new total, and identifies with it. An
// identify with a smaller total than the plan's gets 4011 too.
func (s *Server) Replan(total int, ids []int, journal func(int) *journal.Log, send func(int, []byte) error) error {
	p, err := s.newPlan(total, ids, journal, send)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("relay: Replan after Close")
	}
	old := s.current()
	s.plan.Store(p)
	close(old.stop)
	var conns []*conn
	for _, sess := range s.sessions {
		if sess.plan == old {
			if sess.conn != nil {
				conns = append(conns, sess.conn)
			}
			s.endSessionLocked(sess, "the node moved to a plan of "+strconv.Itoa(total)+" shards")
		}
	}
	s.follow(p)
	s.mu.Unlock()
	s.event("relay-replan", nil, "old_total", strconv.Itoa(old.total), "new_total", strconv.Itoa(total), "closed", strconv.Itoa(len(conns)))
	// Not on the caller's goroutine (the mover's switch): a close frame
	// may wait for a slow client.
	s.wg.Go(func() {
		for _, c := range conns {
			c.closeWith(4011, "Sharding required.", false)
		}
		old.followers.Wait()
		for _, c := range old.shards {
			c.release()
		}
	})
	return nil
}

// ParseKinds parses --relay-cache: kinds separated by commas, "none" for
// none.
func ParseKinds(v string) ([]string, error) {
	if v == "none" {
		return []string{}, nil
	}
	var out []string
	for k := range strings.SplitSeq(v, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("unknown cache kind %q (kinds: %s, or none)", k, strings.Join(Kinds, ","))
		}
		out = append(out, k)
	}
	return out, nil
}

// Serve serves the relay on l until Close. It returns nil after Close.
func (s *Server) Serve(l net.Listener) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.listeners = append(s.listeners, l)
	s.servers = append(s.servers, hs)
	s.mu.Unlock()
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close closes every client with 4000 (their sessions stay resumable for
// a process that comes back with the same state), the listeners and the
// journal followers, and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.current().stop)
	servers := s.servers
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, hs := range servers {
		hs.Close() // hijacked connections are ours to close
	}
	for _, c := range conns {
		c.closeWith(4000, "shardfs is shutting down", false)
	}
	close(s.done)
	s.wg.Wait()
	s.handlers.Wait()
	return nil
}

// gatewayBotPath is discovery under a Discord API base (/api, /api/v10)
// or a Fluxer one (/v1, as in https://api.fluxer.app/v1).
var gatewayBotPath = regexp.MustCompile(`^(/api(/v[0-9]+)?|/v[0-9]+)/gateway(/bot)?/?$`)

// ServeHTTP serves the WebSocket gateway, discovery and the REST
// pass-through.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case websocket.IsWebSocketUpgrade(r):
		s.serveGateway(w, r)
	case gatewayBotPath.MatchString(r.URL.Path) && r.Method == http.MethodGet:
		s.serveDiscovery(w, r)
	case strings.HasPrefix(r.URL.Path, "/api/") && s.proxy != nil:
		s.proxy.ServeHTTP(w, r)
	default:
		http.Error(w, "404: Not Found", http.StatusNotFound)
	}
}

// serveDiscovery answers GET /api/v10/gateway/bot: the relay's URL, the
// plan's total, and a start limit that never makes a library wait (the
// relay's identifies cost the bot nothing).
func (s *Server) serveDiscovery(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/bot") && !s.tokenOK(r.Header.Get("Authorization")) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"message":"401: Unauthorized","code":0}`))
		return
	}
	body := map[string]any{"url": s.publicURL(r)}
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/bot") {
		// The plan's total on Fluxer too, whose own gateway always says 1:
		// a client must identify with the node's total to be served.
		body["shards"] = s.current().total
		body["session_start_limit"] = map[string]int{"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 16}
		if s.fluxer() {
			// Fluxer's documented constants.
			body["session_start_limit"] = map[string]int{"total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(body)
}

// publicURL is the relay's WebSocket URL as the client reached it.
func (s *Server) publicURL(r *http.Request) string {
	scheme := "ws"
	if r.TLS != nil {
		scheme = "wss"
	}
	return scheme + "://" + r.Host
}

// tokenOK compares a token (with or without "Bot ") with the bot's, in
// constant time.
func (s *Server) tokenOK(tok string) bool {
	tok = strings.TrimPrefix(tok, "Bot ")
	return subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.Token)) == 1
}

// fluxer reports whether the relay speaks Fluxer v1.
func (s *Server) fluxer() bool { return s.cfg.Flavor == core.Fluxer }

func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// event writes one line to the node's events log: logfmt, time first.
func (s *Server) event(name string, sess *session, kv ...string) {
	if s.cfg.Events == nil {
		return
	}
	now := s.clock.Now()
	b := []byte("ts=" + now.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	if sess != nil {
		b = append(b, " shard="+strconv.Itoa(sess.shard)...)
	}
	b = append(b, " event="+name...)
	if sess != nil {
		b = append(b, " client="+strconv.Itoa(sess.client)...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if v == "" || strings.ContainsAny(v, " \"=") {
			v = strconv.Quote(v)
		}
		b = append(b, " "+kv[i]+"="+v...)
	}
	b = append(b, '\n')
	s.cfg.Events.Append(b, now)
}
