// Package node assembles one shardfs node: the gateway transport, the
// lifecycle core, the file tree and the 9P server that exports it.
//
// The binary's serve and demo commands, the integration tests and the
// benchmarks all run a node through this package, so that what is tested
// is what ships.
package node

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/lease/local"
	"github.com/shardfs/shardfs/relay"
	"github.com/shardfs/shardfs/reshard"
	"github.com/shardfs/shardfs/shardfs"
)

// Config configures a node. Flavor, Token and Plan are required.
type Config struct {
	Flavor core.Flavor
	// Token is the bot token. It goes to the gateway transport and nowhere
	// else: not to the tree, not to the logs.
	Token string
	// API is the HTTP API base for discovery; GatewayURL skips discovery.
	API, GatewayURL string
	Plan            core.Plan
	Intents         uint64
	Compression     gateway.Compression
	// MaxConcurrency is Discord's max_concurrency until discovery says
	// otherwise (default 1).
	MaxConcurrency int
	// IdentifyTotal is Discord's session start total per 24 h when
	// discovery is skipped (default core.DiscordStartTotal with GatewayURL),
	// and caps what discovery says otherwise (0: no cap).
	IdentifyTotal int
	// IdentifyReserve is how many of those starts automatic new sessions
	// leave to the operator's identify and retry: gateway.DefaultReserve
	// (negative) for 1% of the total, at least 1; 0 for none. Its zero
	// value keeps none: set it to gateway.DefaultReserve for the default.
	IdentifyReserve int
	// FluxerPacing overrides Fluxer's identify budget.
	FluxerPacing core.FluxerPacing
	// Backoff is the reconnect policy; nil means core.DefaultBackoff.
	Backoff core.BackoffPolicy
	// DispatchRetention and NodeDispatchRetention bound the dispatch logs
	// (see shardfs.Config).
	DispatchRetention, NodeDispatchRetention int
	Clock                                    clock.Clock
	Logger                                   *slog.Logger
	// Registry receives the tree's metrics; nil makes a private one.
	Registry *prometheus.Registry
	// EventRetention and NodeEventRetention bound each shard's events
	// log and the node's (see core.Config; defaults 16 KiB and 1 MiB).
	EventRetention, NodeEventRetention int
	// ObserveEvent, when set, also receives the core's event-handling
	// times (see core.Config.ObserveEvent), which /metrics always shows.
	ObserveEvent func(kind string, d time.Duration)

	// Sessions keeps the shards' snapshots across restarts (see
	// core.Config.Sessions); nil keeps none. The caller opens and closes
	// it: Close leaves it open, with the clean stop's snapshots saved.
	Sessions core.SessionStore
	// ResumeWindow is the age beyond which a snapshot is not resumed;
	// zero means the flavor's.
	ResumeWindow time.Duration
	// IdentifyPacer, when set, grants the core's identify slots instead of
	// Pacer (a supervised child asks its parent, which paces every
	// child); Pacer then only takes discovery's figures.
	IdentifyPacer core.IdentifyPacer
	// OnSession receives each new session of a shard (see
	// gateway.Config.OnSession); the session ID is a secret.
	OnSession func(shard int, s core.Session, seq int64)
	// IdentifyNotBefore and IdentifyWritten are the transport's (see
	// gateway.Config): a supervised child takes each identify's floor from
	// its parent's grant and reports each write to it.
	IdentifyNotBefore func(shard int) time.Time
	IdentifyWritten   func(shard int, at time.Time)
	// Gateway is the endpoint Fluxer snapshots must resume on: what the
	// caller discovered before New, as the transport will find it; empty
	// means GatewayURL. With neither, no Fluxer snapshot is resumed.
	Gateway string

	// Reshard moves the node to a larger plan when a shard closes 4011
	// (serve --total auto; see package reshard). Without it a 4011 leaves the
	// shard FATAL and `reshard N` on /ctl moves by hand.
	Reshard bool
	// Etcd, when set, makes the node one of a fleet sharing the bot (see
	// Etcd); Sessions is then etcd's and must be nil.
	Etcd *Etcd
	// Relay, when true, runs the gateway relay (DESIGN section 9, package
	// relay) on the plan's shards, and after a move on the new plan's
	// (the old plan's clients are closed 4011): Node.Relay serves it on the
	// listeners Run opens for serve --relay, and the tree has /relay,
	// /clients and the node command kick.
	Relay bool
	// RelayResumeWindow is how long a relay client's session stays
	// resumable (0: 60 s); RelayCache the cache kinds (nil: the relay's
	// defaults).
	RelayResumeWindow time.Duration
	RelayCache        []string
	// RelayState, when set, is the file the relay's state goes to at a
	// clean stop (Close) and comes from at New, which removes it once
	// read: the cache, a tail of each shard's dispatches and the client
	// sessions, so that clients resume across a clean restart. Run sets
	// it to relay.json in SessionsDir.
	RelayState string

	// MetricsListen, when set, serves /metrics over HTTP for Prometheus
	// on HOST:PORT from Start to Close: loopback only, unless ",insecure"
	// follows (see listenMetrics).
	MetricsListen string
	// Files are more files at the tree's root (a PXE node's /enroll).
	Files []fsrv.File
}

// Format hides the token from every fmt verb.
func (c Config) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "node.Config{Flavor:%v Token:redacted Total:%d Local:%d Intents:%d Compression:%q GatewayURL:%q}", c.Flavor, c.Plan.Total, len(c.Plan.Local), c.Intents, c.Compression, c.GatewayURL)
}

// LogValue hides the token from slog.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("flavor", c.Flavor.String()), slog.String("compression", string(c.Compression)), slog.String("token", "redacted"))
}

// Node is an assembled node. Transport, Lease, Node and Tree are those of
// the plan it started with; after a move to a larger plan, Current gives
// the running one.
type Node struct {
	Transport *gateway.Transport
	Pacer     *core.Pacer
	Lease     *local.OperatorLease
	Scheduler *core.Scheduler
	Tree      *shardfs.Tree
	Server    *fsrv.Server
	// Fleet is the node's part in a fleet (Config.Etcd), else nil.
	Fleet *Fleet
	// Relay is the gateway relay (Config.Relay), else nil.
	Relay *relay.Server

	cfg       Config
	log       *slog.Logger
	clock     clock.Clock
	events    *journal.Log // /events, whatever the plan
	closeOnce sync.Once
	closeErr  error

	planMu sync.RWMutex
	cur    *planRun // the plan the tree shows
	move   *reshard.Mover

	metrics        *metricsServer // nil without Config.MetricsListen
	metricsStarted bool
}

// New assembles a node. Nothing connects until Start.
func New(cfg Config) (_ *Node, err error) {
	var metrics net.Listener
	if cfg.MetricsListen != "" {
		// First, so that a refused address fails New before anything is
		// built.
		if metrics, err = listenMetrics(cfg.MetricsListen); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				metrics.Close()
			}
		}()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := clock.Or(cfg.Clock)
	s := &Node{cfg: cfg, log: log, clock: clk, events: journal.New(cmp.Or(max(cfg.NodeEventRetention, 0), 1<<20))}
	s.Pacer = gateway.NewPacer(clk, gateway.Pacing{Flavor: cfg.Flavor, MaxConcurrency: cfg.MaxConcurrency,
		IdentifyTotal: cfg.IdentifyTotal, IdentifyReserve: cfg.IdentifyReserve,
		Fixed: cfg.GatewayURL != "", Fluxer: fluxerPacing(cfg)})
	if cfg.Etcd != nil {
		if cfg.Sessions != nil {
			return nil, errors.New("node: Config.Sessions and Config.Etcd are exclusive (etcd keeps the sessions)")
		}
		f, err := newFleet(cfg, log, clk)
		if err != nil {
			return nil, err
		}
		s.Fleet, s.cfg.Sessions = f, f.Store
	}
	s.move = s.newMover()
	p, err := s.buildPlan(cfg.Plan, nil)
	if err != nil {
		if s.Fleet != nil {
			s.Fleet.close()
		}
		return nil, err
	}
	s.cur = p
	s.Transport, s.Lease, s.Scheduler, s.Tree = p.transport, p.lease, p.core, p.tree
	if cfg.Relay {
		if s.Relay, err = s.newRelay(p); err != nil {
			p.End()
			if s.Fleet != nil {
				s.Fleet.close()
			}
			return nil, err
		}
	}
	// The root shows the current plan's tree, so that a move to a larger
	// plan switches what every connection sees.
	root := &fsrv.Dir{Name: "/",
		List:   func() []fsrv.File { return s.current().tree.Root().List() },
		Lookup: func(name string) fsrv.File { return s.current().tree.Root().Lookup(name) },
	}
	s.Server = &fsrv.Server{Root: root, Logger: log.With("component", "9p"), Audit: s.audit}
	if metrics != nil {
		s.metrics = newMetricsServer(metrics, func() *prometheus.Registry { return s.current().tree.Registry() })
	}
	return s, nil
}

// info is the part of /plan the core does not know.
func (s *Node) info() [][2]string {
	gw := s.cfg.GatewayURL
	if gw == "" {
		gw = "discovered from " + orString(s.cfg.API, defaultAPI(s.cfg.Flavor))
	}
	out := [][2]string{{"gateway", gw}, {"compression", orString(string(s.cfg.Compression), "none")}}
	mc := s.Pacer.MaxConcurrency()
	waiting, next := s.Pacer.Waiting()
	if s.Fleet != nil && s.Fleet.Identify != nil {
		b := s.Fleet.Identify.Budget()
		mc, waiting, next = b.MaxConcurrency, b.Waiting, b.NextSlot
	}
	if s.cfg.Flavor == core.Discord {
		out = append(out, [2]string{"intents", strconv.FormatUint(s.cfg.Intents, 10)}, [2]string{"max_concurrency", strconv.Itoa(mc)})
	}
	backoff := "default"
	if f, ok := s.cfg.Backoff.(core.Fixed); ok {
		backoff = fmt.Sprintf("fixed:%v", time.Duration(f))
	}
	out = append(out, [2]string{"backoff", backoff}, [2]string{"identify_waiting", strconv.Itoa(waiting)})
	if !next.IsZero() {
		out = append(out, [2]string{"identify_next", next.UTC().Format("2006-01-02T15:04:05.000Z07:00")})
	}
	return out
}

func defaultAPI(f core.Flavor) string {
	if f == core.Fluxer {
		return gateway.FluxerAPI
	}
	return gateway.DiscordAPI
}

func orString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Start starts the shards in shard order. In a fleet every candidate
// starts not owned, and the ownership loop grants the node its share.
func (s *Node) Start() {
	c := s.current().core
	if s.Fleet != nil {
		for _, id := range c.Plan().Local {
			c.SetLease(core.NotOwned(id))
		}
	}
	c.Start()
	if s.Fleet != nil {
		s.Fleet.start(c)
	}
	if s.metrics != nil {
		s.metrics.start()
		s.metricsStarted = true
	}
}

// Serve exports the tree on every listener until ctx ends or Close is
// called, and waits for the connections it served.
func (s *Node) Serve(ctx context.Context, ls ...net.Listener) error {
	var wg sync.WaitGroup
	errs := make([]error, len(ls))
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Server.Serve(ctx, l); err != nil && !errors.Is(err, fsrv.ErrServerClosed) {
				errs[i] = fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close stops the shards (their sessions stay resumable: connections close
// with 4000, and with Config.Sessions each shard's snapshot is saved before
// Close returns), the gateway transport and the 9P server, and waits for
// all of their goroutines.
func (s *Node) Close() error {
	s.closeOnce.Do(func() {
		if s.Fleet != nil {
			s.Fleet.shutdown() // hands the shards over first
		}
		var errs []error
		if s.Relay != nil {
			// First: its clients close 4000 while the shards still run.
			errs = append(errs, s.Relay.Close())
		}
		// A move cut short ends its new plan: its sessions are of no use.
		errs = append(errs, s.move.Close())
		// After a move the first plan ended at the switch, its transport
		// closed with it.
		cur := s.current()
		cur.core.Close()
		errs = append(errs, cur.transport.Close())
		if s.Relay != nil && s.cfg.RelayState != "" {
			// After the shards stopped: the saved tail ends where their
			// saved sessions do.
			errs = append(errs, s.saveRelay())
		}
		errs = append(errs, s.Server.Close())
		if s.metrics != nil {
			errs = append(errs, s.metrics.close(s.metricsStarted))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// audit writes an accepted ctl or send write into the node's /events
// (DESIGN 7.7: who did it, through which listener).
func (s *Node) audit(r fsrv.AuditRecord) {
	now := s.clock.Now()
	line := fmt.Sprintf("ts=%s event=write %s\n", now.UTC().Format("2006-01-02T15:04:05.000Z"), r)
	s.events.Append([]byte(line), now)
}

// newRelay makes the gateway relay of the plan p: it reads p's dispatch
// journals and sends through p's core. A move to a larger plan moves the
// relay at the switch (replanRelay).
func (s *Node) newRelay(p *planRun) (*relay.Server, error) {
	api := ""
	if s.cfg.Flavor == core.Discord {
		// REST goes to the API's origin with the path the bot asked for.
		if u, err := url.Parse(orString(s.cfg.API, gateway.DiscordAPI)); err == nil && u.Host != "" {
			api = u.Scheme + "://" + u.Host
		}
	}
	var state io.Reader
	if s.cfg.RelayState != "" {
		b, err := os.ReadFile(s.cfg.RelayState)
		switch {
		case err == nil:
			state = bytes.NewReader(b)
			// Read once: a crash later must not bring back this state.
			os.Remove(s.cfg.RelayState)
		case !errors.Is(err, fs.ErrNotExist):
			s.log.Warn("relay: the saved state is unreadable; clients start anew", "err", err)
		}
	}
	cfg := relay.Config{
		Token: s.cfg.Token, Flavor: s.cfg.Flavor, Intents: s.cfg.Intents, Total: p.Plan().Total, Shards: p.Plan().Local,
		Journal: p.tree.DispatchLog, Send: p.core.Send,
		ResumeWindow: s.cfg.RelayResumeWindow, Cache: s.cfg.RelayCache, API: api,
		Events: s.events, Clock: s.cfg.Clock, Logger: s.log.With("component", "relay"),
	}
	cfg.State = state
	r, err := relay.New(cfg)
	if err != nil && state != nil {
		s.log.Warn("relay: the saved state does not fit; clients start anew", "err", err)
		cfg.State = nil
		r, err = relay.New(cfg)
	}
	if err != nil {
		return nil, err
	}
	p.tree.Registry().MustRegister(r.Collector())
	return r, nil
}

// saveRelay writes the relay's state to Config.RelayState, whole or not
// at all.
func (s *Node) saveRelay() error {
	tmp := s.cfg.RelayState + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("relay state: %w", err)
	}
	err = s.Relay.Save(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.cfg.RelayState)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("relay state: %w", err)
	}
	return nil
}
