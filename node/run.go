package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/sessions/dir"
)

// RunConfig configures Run: what serve's flags say, checked. Config is
// New's, but for Plan, Sessions, Gateway and Reshard, which Run sets.
type RunConfig struct {
	Config
	// Total is the plan's total; 0 means auto, discovery's recommendation.
	Total int
	// Shards are the node's shards; nil means all of the total.
	Shards []int
	// Listen are the 9P listeners' addresses (see fsrv.ParseListenAddr),
	// TLS the files its tls! ones serve with, MaxConns the connections
	// served at once (0: fsrv's default).
	Listen   []string
	TLS      fsrv.TLSFiles
	MaxConns int
	// ListenOptional are listeners opened beside Listen when they can
	// be: one that cannot is logged and left out (serve's default
	// loopback TCP, whose port another local user may hold; see
	// fsrv.Listeners.OpenOptional).
	ListenOptional []string
	// IdleTimeout closes a TCP or TLS connection with no request for
	// that long (0: fsrv's default; negative: never).
	IdleTimeout time.Duration
	// Relay are the gateway relay's listeners (serve --relay, the syntax
	// of Listen; the tls! ones with TLS's files); none runs no relay.
	Relay []string
	// SessionsDir, when set, is the folder of session snapshots
	// (sessions/dir): Run locks it before anything is spent on the
	// gateway, and closes it after the node saved every shard.
	SessionsDir string
	// Status, when set, draws the startup progress as one line (a
	// terminal's); else the progress is logged every 10 s.
	Status func(line string, final bool)
	// Parent is the supervisor the node runs under, if any.
	Parent Parent
}

// Parent is the supervisor a node runs under as one of its children
// (serve started by supervise): the node takes its identify slots from
// it and reports to it.
type Parent interface {
	// Configure sets cfg's identify hooks, before New.
	Configure(cfg *Config)
	// Starting is told of the node before its Start.
	Starting(n *Node)
	// Serving is told that the node serves its tree, at socket (its first
	// unix listener, or empty); it reports n until ctx ends.
	Serving(ctx context.Context, n *Node, socket string)
}

// Run opens the listeners, locks the sessions folder, discovers before
// the start when it must, assembles the node for the plan, starts it and
// serves its tree until ctx ends, then closes it cleanly: every session
// stays resumable, and saved with SessionsDir.
//
// Listeners open first, so that a refused one fails Run before discovery
// spends a request. For Fluxer with SessionsDir, Run discovers before the
// start even with a Total: the core checks each Fluxer snapshot against
// the endpoint, which it must know before the first load. A failed early
// discovery is not fatal (a store problem never stops a shard): every
// Fluxer shard then starts a new session.
func Run(ctx context.Context, rc RunConfig) error {
	log := rc.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ls, err := fsrv.Open(rc.Listen, rc.TLS)
	if err != nil {
		return err
	}
	ls.OpenOptional(rc.ListenOptional, log)
	var relayLs []net.Listener
	if len(rc.Relay) > 0 {
		if relayLs, err = openRelay(rc.Relay, rc.TLS); err != nil {
			ls.Close()
			return fmt.Errorf("--relay: %w", err)
		}
		rc.Config.Relay = true
		if rc.SessionsDir != "" {
			rc.Config.RelayState = filepath.Join(rc.SessionsDir, "relay.json")
		}
		defer func() {
			for _, l := range relayLs {
				l.Close()
			}
		}()
	}
	// The folder is locked before anything is spent on the gateway: a
	// second serve on it stops here, naming the first's PID.
	var store *dir.Store
	if rc.SessionsDir != "" {
		if store, err = dir.Open(rc.SessionsDir, dir.Options{Logger: log.With("component", "sessions")}); err != nil {
			ls.Close()
			return fmt.Errorf("--sessions: %w", err)
		}
		// After the node closed: Close saves every shard into it.
		defer func() {
			if err := store.Close(); err != nil {
				log.Error("closing the sessions folder", "err", err)
			}
		}()
	}
	n, limit, err := assemble(ctx, rc, store, log)
	if err != nil {
		ls.Close()
		return err
	}
	// One gateway socket a shard, any of the plan's for a fleet member.
	n.Server.MaxConns = fsrv.FitMaxConns(log, rc.MaxConns, n.Scheduler.Plan().Total)
	n.Server.IdleTimeout = rc.IdleTimeout
	switch {
	case rc.Flavor != core.Discord:
	case limit != nil && n.Fleet != nil && n.Fleet.Identify != nil:
		n.Fleet.Identify.SetStartLimit(*limit)
	case limit != nil:
		n.Pacer.SetStartLimit(*limit) // what discovery said, before the first identify
	case rc.GatewayURL == "":
		// The identify budget must be known before the first identify:
		// until then the pacer enforces nothing. A failure is the
		// shards' to report, as they discover again when they connect.
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := n.Transport.Discover(dctx); err != nil {
			log.Debug("discovery before the start failed; the shards discover when they connect", "err", err)
		}
		cancel()
	}
	ls.Log(log)
	if ls.HasTLS() {
		stopReload := ls.ReloadOnHangup(log)
		defer stopReload()
	}
	if rc.Parent != nil {
		rc.Parent.Starting(n)
	}
	n.Start()
	pctx, stopProgress := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if rc.Parent != nil {
		rc.Parent.Serving(pctx, n, ls.Socket())
	}
	if relayLs != nil {
		for _, l := range relayLs {
			log.Info("relay listening", "addr", l.Addr().String())
			// Serve returns when the node's Close closes the relay.
			wg.Go(func() {
				if err := n.Relay.Serve(l); err != nil {
					log.Error("relay listener failed", "addr", l.Addr().String(), "err", err)
				}
			})
		}
	}
	var refused error
	if n.Fleet == nil {
		wg.Go(func() { progress(pctx, n, log, rc.Status) })
	} else {
		// A node etcd refuses (a plan mismatch) stops serving and exits
		// with the refusal, which names both plans.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() {
			select {
			case refused = <-n.Fleet.Refused():
				cancel()
			case <-pctx.Done():
			}
		})
	}
	err = n.ServeAndClose(ctx, ls.List...)
	stopProgress()
	wg.Wait()
	if refused != nil {
		return refused
	}
	return err
}

// assemble discovers before the start when it must, and makes the node of
// the plan; limit is discovery's session start limit, if it said one.
func assemble(ctx context.Context, rc RunConfig, store *dir.Store, log *slog.Logger) (n *Node, limit *core.StartLimit, err error) {
	cfg, total := rc.Config, rc.Total
	// Gateway is the discovered endpoint, what Fluxer snapshots are
	// checked against: the URL the gateway client stores in a Fluxer
	// session is the one it connected to, discovery's (or GatewayURL).
	fluxerResume := cfg.Flavor == core.Fluxer && store != nil && cfg.GatewayURL == ""
	if total == 0 || fluxerResume {
		d, ok, err := gateway.DiscoverBeforeStart(ctx, cfg.Flavor, cfg.API, cfg.Token, total == 0, log,
			"no saved Fluxer session can be checked, so every shard starts a new one")
		if err != nil {
			return nil, nil, err
		}
		if ok {
			cfg.Gateway, limit = d.URL, &d.StartLimit
		}
		if total == 0 {
			total = d.Shards
		}
	}
	if cfg.Etcd != nil && total != 0 && !fluxerResume {
		// A fleet node checks the bot's token before it joins: one that
		// joined with a wrong token took shards from healthy nodes (they
		// stopped good sessions to hand them over) and kept them FATAL
		// (the attack on issue 22). Any other discovery failure is not
		// the token's, and the node joins as before.
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		d, derr := gateway.Discover(dctx, nil, cfg.Flavor, cfg.API, cfg.Token)
		cancel()
		switch {
		case errors.Is(derr, gateway.ErrUnauthorized):
			return nil, nil, fmt.Errorf("discovery before joining the fleet: %w; not joining, so that no shard is taken from a node whose token works", derr)
		case derr == nil:
			cfg.Gateway, limit = d.URL, &d.StartLimit
		default:
			log.Warn("discovery before joining the fleet failed; joining anyway", "err", derr)
		}
	}
	if cfg.Plan, err = Plan(total, rc.Shards); err != nil {
		return nil, nil, err
	}
	// A 4011 moves to a larger plan only when the plan is the platform's
	// and this node runs all of it, alone (DESIGN 7.5).
	cfg.Reshard = rc.Total == 0 && rc.Shards == nil && cfg.Etcd == nil && rc.Parent == nil
	if store != nil {
		cfg.Sessions = store // a nil *dir.Store would be a non-nil interface
	}
	if rc.Parent != nil {
		rc.Parent.Configure(&cfg)
	}
	var built *Node
	if store != nil && rc.Parent == nil && cfg.Flavor == core.Discord && cfg.Etcd == nil && cfg.IdentifyNotBefore == nil && cfg.IdentifyWritten == nil {
		mc := func() int {
			if built != nil {
				return built.Pacer.MaxConcurrency()
			}
			return cfg.MaxConcurrency
		}
		cfg.IdentifyNotBefore, cfg.IdentifyWritten = keptIdentifyTimes(rc.SessionsDir, mc, log)
	}
	n, err = New(cfg)
	built = n
	return n, limit, err
}

// keptIdentifyTimes spaces each shard's identify from the last one its
// bucket wrote, by this process or a predecessor (kept beside the
// sessions, dir.IdentifyTimesFile), and saves every write: a new process
// does not know its predecessor's identifies otherwise, and the gateway
// refuses (op 9) an identify 5 s too close to the last of its bucket.
func keptIdentifyTimes(folder string, mc func() int, log *slog.Logger) (notBefore func(int) time.Time, written func(int, time.Time)) {
	var mu sync.Mutex
	times, err := dir.LoadIdentifyTimes(folder)
	if err != nil {
		log.Warn("the last identify times cannot be read: the first identifies are spaced from nothing", "err", err)
	}
	notBefore = func(shard int) time.Time {
		mu.Lock()
		defer mu.Unlock()
		if w := times.Floor(shard, mc()); !w.IsZero() {
			return w.Add(core.DiscordWindow + gateway.DefaultIdentifyMargin)
		}
		return time.Time{}
	}
	written = func(shard int, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		m := max(mc(), 1)
		if times.MaxConcurrency != m {
			// Other buckets: the latest write floors them all.
			last := times.Floor(0, -1)
			times = dir.IdentifyTimes{MaxConcurrency: m, Written: map[int]time.Time{}}
			for key := range m {
				if !last.IsZero() {
					times.Written[key] = last
				}
			}
		}
		if times.Written == nil {
			times.Written = map[int]time.Time{}
		}
		if at.After(times.Written[shard%m]) {
			times.Written[shard%m] = at
		}
		if err := dir.SaveIdentifyTimes(folder, times); err != nil {
			log.Warn("saving the last identify times", "err", err)
		}
	}
	return notBefore, written
}

// Plan is the plan of the shards local of total (all of them when local
// is nil).
func Plan(total int, local []int) (core.Plan, error) {
	if total > core.MaxTotal {
		return core.Plan{}, fmt.Errorf("total %d is over %d", total, core.MaxTotal)
	}
	plan := core.Plan{Total: total, Local: local}
	if local == nil {
		plan = core.Range(total, 0, total-1)
	}
	if err := plan.Validate(); err != nil {
		return plan, fmt.Errorf("plan: %w", err)
	}
	return plan, nil
}

// ServeAndClose serves the tree on ls until ctx ends (or serving fails),
// then closes the node: its gateway connections close with 4000, so that
// the sessions stay resumable.
func (s *Node) ServeAndClose(ctx context.Context, ls ...net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ls...) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		cancel()
	}
	s.log.Info("shutting down: closing gateway connections with 4000 so that sessions stay resumable")
	cerr := s.Close()
	if err == nil {
		err = <-served
	}
	return errors.Join(err, cerr)
}

// progress reports startup: shards READY out of the local total, the next
// identify slot and an estimate of the time left. With status (a
// terminal) it redraws one status line; else it logs every 10 s. It looks
// again at every lifecycle event and returns once every shard is READY
// (or FATAL), or ctx ends.
func progress(ctx context.Context, n *Node, log *slog.Logger, status func(line string, final bool)) {
	tty := status != nil
	interval := 10 * time.Second
	if tty {
		interval = 500 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	start := time.Now()
	diags := make([]core.Diag, 0, len(n.Scheduler.Plan().Local))
	events := n.Scheduler.Events()
	var line string
	for {
		cur, _ := n.Current() // after a move to a larger plan, the new one
		diags = cur.Snapshot(diags[:0])
		ready, fatal := 0, 0
		for _, d := range diags {
			switch d.State {
			case core.Ready:
				ready++
			case core.Fatal:
				fatal++
			}
		}
		waiting, next := n.Pacer.Waiting()
		left := n.Pacer.DrainTime().Round(time.Second)
		nextIn := "none"
		if !next.IsZero() {
			nextIn = time.Until(next).Round(100 * time.Millisecond).String()
		}
		done := ready+fatal == len(diags)
		if tty {
			line = fmt.Sprintf("startup: %d/%d READY, %d FATAL, %d waiting to identify, next slot in %s, about %s left", ready, len(diags), fatal, waiting, nextIn, left)
			if done {
				status(fmt.Sprintf("startup done in %s: %d READY, %d FATAL", time.Since(start).Round(time.Second), ready, fatal), true)
			} else {
				status(line, false)
			}
		} else if done {
			log.Info("startup done", "ready", ready, "fatal", fatal, "took", time.Since(start).Round(time.Second))
		} else {
			log.Info("startup", "ready", ready, "total", len(diags), "fatal", fatal, "identify_waiting", waiting, "next_slot_in", nextIn, "left", left)
		}
		if done {
			return
		}
		for quiet := true; quiet; {
			select {
			case <-ctx.Done():
				if tty {
					status(line, true)
				}
				return
			case <-tick.C:
				quiet = false
			case <-events.Notify():
				// Check for the end at once; report only on the tick.
				cur, _ := n.Current()
				quiet = !allSettled(cur.Snapshot(diags[:0]))
			}
		}
	}
}

func allSettled(diags []core.Diag) bool {
	for _, d := range diags {
		if d.State != core.Ready && d.State != core.Fatal {
			return false
		}
	}
	return true
}

// openRelay opens the relay's listeners. A tls! one is a TLS server with
// --tls-cert and --tls-key and no client certificate: bot libraries dial
// wss:// as they would Discord, and the relay checks the bot's token. (An
// fsrv tls! listener leaves the handshake to the 9P server, and asks for
// client certificates: the relay's would have served no TLS at all.)
func openRelay(addrs []string, files fsrv.TLSFiles) ([]net.Listener, error) {
	var out []net.Listener
	fail := func(err error) ([]net.Listener, error) {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	for _, a := range addrs {
		la, err := fsrv.ParseListenAddr(a)
		if err != nil {
			return fail(err)
		}
		if !la.TLS {
			l, err := fsrv.Listen(a)
			if err != nil {
				return fail(err)
			}
			out = append(out, l)
			continue
		}
		if files.Cert == "" || files.Key == "" {
			return fail(fmt.Errorf("%s: a tls! relay listener needs --tls-cert and --tls-key", a))
		}
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", a, err))
		}
		l, err := net.Listen(la.Network, la.Address)
		if err != nil {
			return fail(err)
		}
		out = append(out, tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}
	return out, nil
}
