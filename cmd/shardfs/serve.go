package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/sessions/dir"
)

// runServe runs a node against the real gateway. The token comes from
// SHARDFS_TOKEN or --token-file, never from a flag value, so that it does
// not show in ps or the shell history.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return serve(ctx, args, stdout, stderr, readToken)
}

// serve is runServe with the token from tokenFrom (called with --token-file's
// value): PID 1 of a bare-metal node hands over the token it already read.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, tokenFrom func(file string) (string, error)) error {
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var f serveFlags
	f.register(fl)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	o, err := f.check(fl)
	if err != nil {
		return err
	}
	flavor, comp, backoff, total := o.flavor, o.compression, o.backoff, o.total
	apiURL, gatewayURL, totalFlag, shards, sessDir := f.api, f.gatewayURL, f.total, f.shards, f.sessions
	reserve := *f.idReserve // node.Config: 0 is the default, negative none
	switch reserve {
	case -1:
		reserve = 0
	case 0:
		reserve = -1
	}
	if *totalFlag != "auto" {
		if _, err := planFor(total, *shards); err != nil {
			return flagErr(fl, "%v", err)
		}
	}
	etcdCfg, err := f.etcd.config(*sessDir != "")
	if err != nil {
		return flagErr(fl, "%v", err)
	}
	token, err := tokenFrom(*f.tokenFile)
	if err != nil {
		return err
	}
	ctx, link, err := supervisedChild(ctx)
	if err != nil {
		return err
	}
	defer link.Close()
	// Listeners open first, so that a refused one fails serve before
	// discovery spends a request.
	ls, err := listen(f.listens, serveListeners(), &f.tls)
	if err != nil {
		return err
	}
	log, status, stopLog := newLogger(stderr, *f.debug)
	defer stopLog()

	// The folder is locked before anything is spent on the gateway: a
	// second serve on it stops here, naming the first's PID. After the
	// re-exec of readToken, so the lock is the serving image's.
	var store *dir.Store
	if *sessDir != "" {
		if store, err = dir.Open(*sessDir, dir.Options{Logger: log.With("component", "sessions")}); err != nil {
			closeListeners(ls)
			return fmt.Errorf("--sessions: %w", err)
		}
		// After the node closed: Close saves every shard into it.
		defer func() {
			if err := store.Close(); err != nil {
				log.Error("closing the sessions folder", "err", err)
			}
		}()
	}

	var limit *core.StartLimit
	// endpoint is the discovered gateway, what Fluxer snapshots are
	// checked against: the URL the gateway client stores in a Fluxer
	// session is the one it connected to, discovery's (or --gateway).
	var endpoint string
	fluxerResume := flavor == core.Fluxer && store != nil && *gatewayURL == ""
	if *totalFlag == "auto" || fluxerResume {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		disc, err := gateway.Discover(dctx, nil, flavor, *apiURL, token)
		cancel()
		switch {
		case err != nil && *totalFlag == "auto":
			closeListeners(ls)
			return fmt.Errorf("--total auto: %w", err)
		case err != nil:
			// A store problem never stops a shard; without the
			// endpoint no Fluxer snapshot can be checked, so none
			// is resumed.
			log.Error("discovery before the start failed: no saved Fluxer session can be checked, so every shard starts a new one", "err", err)
		default:
			endpoint = disc.URL
			limit = &disc.StartLimit
		}
		if *totalFlag == "auto" {
			total = disc.Shards
			log.Info("discovered the recommended shard count", "total", total)
		}
	}
	plan, err := planFor(total, *shards)
	if err != nil {
		closeListeners(ls)
		return flagErr(fl, "%v", err)
	}

	cfg := node.Config{
		Flavor: flavor, Token: token, API: *apiURL, GatewayURL: *gatewayURL,
		Plan: plan, Intents: *f.intents, Compression: comp, Backoff: backoff, Logger: log,
		MaxConcurrency: *f.maxConc, IdentifyTotal: *f.idTotal, IdentifyReserve: reserve,
		ResumeWindow: *f.resumeWindow, Gateway: endpoint, Etcd: etcdCfg, MetricsListen: *f.metricsListen,
		// A 4011 moves to a larger plan only when the plan is the
		// platform's and this node runs all of it, alone (DESIGN 7.5).
		Reshard: *totalFlag == "auto" && *shards == "" && etcdCfg == nil && link == nil,
	}
	if store != nil {
		cfg.Sessions = store // a nil *dir.Store would be a non-nil interface
	}
	link.configure(&cfg)
	n, err := node.New(cfg)
	if err != nil {
		closeListeners(ls)
		return err
	}
	n.Server.MaxConns = *f.maxConns
	link.refuseMoves(n)
	switch {
	case flavor != core.Discord:
	case limit != nil && n.Fleet != nil && n.Fleet.Identify != nil:
		n.Fleet.Identify.SetStartLimit(*limit)
	case limit != nil:
		n.Pacer.SetStartLimit(*limit) // what discovery said, before the first identify
	case *gatewayURL == "":
		// The identify budget must be known before the first identify:
		// until then the pacer enforces nothing. A failure is the
		// shards' to report, as they discover again when they connect.
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := n.Transport.Discover(dctx); err != nil {
			log.Debug("discovery before the start failed; the shards discover when they connect", "err", err)
		}
		cancel()
	}
	for _, l := range ls {
		log.Info("serving the tree over 9P", "addr", addrString(l.l), "access", l.access())
	}
	f.tls.logCert(log, time.Now())
	link.reportLimits(n)
	n.Start()
	pctx, stopProgress := context.WithCancel(ctx)
	var wg sync.WaitGroup
	link.started(pctx, n, ls, log)
	var refused error
	if n.Fleet == nil {
		wg.Go(func() { progress(pctx, n, log, status) })
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
	err = runNode(ctx, n, netListeners(ls), log)
	stopProgress()
	wg.Wait()
	if refused != nil {
		return refused
	}
	return err
}

// planFor is the plan of shards (all of total when empty).
func planFor(total int, shards string) (core.Plan, error) {
	if total > core.MaxTotal {
		return core.Plan{}, fmt.Errorf("total %d is over %d", total, core.MaxTotal)
	}
	plan := core.Plan{Total: total}
	if shards == "" {
		plan = core.Range(total, 0, total-1)
	} else {
		ids, err := core.ParseShardList(shards)
		if err != nil {
			return plan, fmt.Errorf("--shards: %w", err)
		}
		plan.Local = ids
	}
	if err := plan.Validate(); err != nil {
		return plan, fmt.Errorf("plan: %w", err)
	}
	return plan, nil
}

// serveFlags are serve's flags, which supervise takes too (one definition
// for both: supervise passes the children's on, and refuses those it
// cannot honour yet).
type serveFlags struct {
	flavor, api, gatewayURL, total, shards *string
	intents                                *uint64
	maxConc, idTotal, idReserve            *int
	compress, backoff, tokenFile           *string
	debug                                  *bool
	listens                                listenFlag
	tls                                    tlsFlags
	maxConns                               *int
	sessions                               *string
	resumeWindow                           *time.Duration
	etcd                                   etcdFlags
	metricsListen                          *string
}

func (f *serveFlags) register(fl *flag.FlagSet) {
	f.flavor = fl.String("flavor", "", "gateway flavor: discord or fluxer (required)")
	f.api = fl.String("api", "", "HTTP API base for discovery (default: the platform's)")
	f.gatewayURL = fl.String("gateway", "", "gateway WebSocket URL; skips discovery")
	f.total = fl.String("total", "", "global shard count, or auto for the platform's recommendation (required)")
	f.shards = fl.String("shards", "", "local shard IDs, e.g. 0-3,7 (default: all of the total)")
	f.intents = fl.Uint64("intents", 0, "Discord gateway intents bit field")
	f.maxConc = fl.Int("max-concurrency", 1, "Discord max_concurrency until discovery says otherwise (with --gateway there is no discovery)")
	f.idTotal = fl.Int("identify-total", 0, "Discord session starts per 24 h: with --gateway the total (default 1000), else a cap on what discovery says")
	f.idReserve = fl.Int("identify-reserve", -1, "session starts automatic new sessions leave to the operator's identify and retry (-1: 1% of the total, at least 1)")
	f.compress = fl.String("compress", "none", "transport compression: none, zlib-stream or zstd-stream")
	f.backoff = fl.String("backoff", "default", "reconnect backoff: default or fixed:DURATION")
	f.tokenFile = fl.String("token-file", "", "file holding the bot token (else SHARDFS_TOKEN)")
	f.debug = fl.Bool("debug", false, "log at debug level")
	f.tls.register(fl)
	fl.Var(&f.listens, "listen", "9P listener: unix!path, a path, tcp!host!port or host:port, with ,ro (read-only) or ,insecure (plain TCP beyond loopback) after it (repeatable; default: unix!"+defaultSocket()+" and "+fsrv.DefaultAddr+",ro); tls!host!port serves 9P over TLS 1.3 with client certificates (--tls-cert, --tls-key, --tls-client-ca)")
	f.maxConns = fl.Int("max-conns", fsrv.DefaultMaxConns, "9P connections served at once; more are refused")
	f.sessions = fl.String("sessions", "", "folder of session snapshots: a clean stop saves every shard's session there and the next start resumes it (created 0700; locked)")
	f.resumeWindow = fl.Duration("resume-window", 0, "age beyond which a saved session is not resumed (0: the flavor's, 120s Discord, 60s Fluxer)")
	f.etcd.register(fl)
	f.metricsListen = fl.String("metrics-listen", "", "serve /metrics over HTTP for Prometheus on HOST:PORT, e.g. 127.0.0.1:9464 (loopback only unless ,insecure follows)")
}

// serveOpts are the checked values of serveFlags.
type serveOpts struct {
	flavor      core.Flavor
	compression gateway.Compression
	backoff     core.BackoffPolicy
	total       int // 0 for auto
}

// check refuses bad values with an error naming the flag.
func (f *serveFlags) check(fl *flag.FlagSet) (serveOpts, error) {
	var o serveOpts
	var err error
	if o.flavor, err = core.ParseFlavor(*f.flavor); err != nil {
		return o, flagErr(fl, "--flavor: %v", err)
	}
	if *f.idTotal < 0 {
		return o, flagErr(fl, "--identify-total %d: want 0 (from discovery) or more", *f.idTotal)
	}
	if *f.idReserve < -1 {
		return o, flagErr(fl, "--identify-reserve %d: want -1 (the default) or more", *f.idReserve)
	}
	if *f.resumeWindow < 0 {
		return o, flagErr(fl, "--resume-window %v: want 0 (the flavor's) or more", *f.resumeWindow)
	}
	if o.compression, err = gateway.ParseCompression(*f.compress); err != nil {
		return o, flagErr(fl, "--compress: %v", err)
	}
	if o.backoff, err = core.ParseBackoff(*f.backoff); err != nil {
		return o, flagErr(fl, "--backoff: %v", err)
	}
	if *f.total == "" {
		return o, flagErr(fl, "--total is required: a shard count or auto")
	}
	if *f.total != "auto" {
		if o.total, err = strconv.Atoi(*f.total); err != nil || o.total < 1 || o.total > core.MaxTotal {
			return o, flagErr(fl, "--total %q: want a count from 1 to %d, or auto", *f.total, core.MaxTotal)
		}
	}
	return o, nil
}
