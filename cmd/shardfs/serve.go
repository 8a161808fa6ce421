package main

import (
	"context"
	"flag"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/relay"
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
	return serveFiles(ctx, args, stdout, stderr, tokenFrom, nil)
}

// serveFiles is serve with more files at the tree's root (a PXE node's
// /enroll).
func serveFiles(ctx context.Context, args []string, stdout, stderr io.Writer, tokenFrom func(file string) (string, error), files []fsrv.File) error {
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
	rc, err := f.runConfig(fl)
	if err != nil {
		return err
	}
	if rc.Token, err = tokenFrom(*f.tokenFile); err != nil {
		return err
	}
	ctx, link, err := supervisedChild(ctx)
	if err != nil {
		return err
	}
	defer link.Close()
	log, status, stopLog := newLogger(stderr, *f.debug)
	defer stopLog()
	if link != nil {
		link.log = log
		rc.Parent = link // a nil *childLink would be a non-nil interface
	}
	rc.Logger, rc.Status = log, status
	rc.Files = files
	return node.Run(ctx, rc)
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
	idleTimeout                            *time.Duration
	tlsDeny                                *string
	sessions                               *string
	resumeWindow                           *time.Duration
	etcd                                   etcdFlags
	metricsListen                          *string
	relays                                 listenFlag
	relayResumeWindow                      *time.Duration
	relayCache                             *string
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
	f.idReserve = fl.Int("identify-reserve", -1, "session starts automatic new sessions leave to the operator's identify and retry (-1: 1% of the total, at least 1; 0: none)")
	f.compress = fl.String("compress", "none", "transport compression: none, zlib-stream or zstd-stream")
	f.backoff = fl.String("backoff", "default", "reconnect backoff: default or fixed:DURATION")
	f.tokenFile = fl.String("token-file", "", "file holding the bot token (else SHARDFS_TOKEN)")
	f.debug = fl.Bool("debug", false, "log at debug level")
	f.tls.register(fl)
	fl.Var(&f.listens, "listen", "9P listener: unix!path, a path, tcp!host!port or host:port, with ,ro (read-only), ,insecure (plain TCP beyond loopback) or ,max=N (its own connection cap) after it (repeatable; default: unix!"+fsrv.DefaultSocket()+" and "+fsrv.DefaultAddr+",ro); tls!host!port serves 9P over TLS 1.3 with client certificates (--tls-cert, --tls-key, --tls-client-ca, or ,ca=FILE for this listener) and takes ,clients=FILE (lines CN|fingerprint ro|rw)")
	f.maxConns = fl.Int("max-conns", fsrv.DefaultMaxConns, "9P connections served at once; more are told the server is full ("+strconv.Itoa(fsrv.DefaultUnixReserve)+" kept for unix sockets; a TCP or TLS listener takes "+strconv.Itoa(fsrv.DefaultListenerConns)+" unless ,max=N follows its address)")
	f.idleTimeout = fl.Duration("idle-timeout", fsrv.DefaultIdleTimeout, "close a TCP or TLS 9P connection that sent no request for this long (0: never; unix sockets are never closed for idling)")
	f.tlsDeny = fl.String("tls-deny", "", "file of client certificates every tls! listener refuses, one serial (hex) or SHA-256 fingerprint a line; read again on SIGHUP")
	f.sessions = fl.String("sessions", "", "folder of session snapshots: a clean stop saves every shard's session there and the next start resumes it (created 0700; locked)")
	f.resumeWindow = fl.Duration("resume-window", 0, "age beyond which a saved session is not resumed (0: the flavor's, 120s Discord, 60s Fluxer)")
	f.etcd.register(fl)
	f.metricsListen = fl.String("metrics-listen", "", "serve /metrics over HTTP for Prometheus on HOST:PORT, e.g. 127.0.0.1:9464 (loopback only unless ,insecure follows)")
	fl.Var(&f.relays, "relay", "gateway relay listener: bot libraries connect to it as to the gateway (HOST:PORT or tcp!HOST!PORT, loopback unless ,insecure; tls!HOST!PORT with --tls-cert/--tls-key) (repeatable; see doc/relay.md)")
	f.relayResumeWindow = fl.Duration("relay-resume-window", 60*time.Second, "how long a relay client's session stays resumable after its connection ends")
	f.relayCache = fl.String("relay-cache", strings.Join(relay.DefaultKinds, ","), "relay cache kinds, comma-separated ("+strings.Join(relay.Kinds, ",")+"), or none")
}

// runConfig is node.Run's configuration from the flags, checked (but
// for the token, the logger and the parent).
func (f *serveFlags) runConfig(fl *flag.FlagSet) (node.RunConfig, error) {
	o, err := f.check(fl)
	if err != nil {
		return node.RunConfig{}, err
	}
	etcdCfg, err := f.etcd.config(*f.sessions != "")
	if err != nil {
		return node.RunConfig{}, flagErr(fl, "%v", err)
	}
	if *f.metricsListen != "" {
		// Before discovery spends a request, like a refused listener.
		if err := node.CheckMetricsListen(*f.metricsListen); err != nil {
			return node.RunConfig{}, flagErr(fl, "--metrics-listen: %v", err)
		}
	}
	listen, optional := f.listenAddrs()
	var relayCache []string
	if len(f.relays) > 0 {
		if relayCache, err = relay.ParseKinds(*f.relayCache); err != nil {
			return node.RunConfig{}, flagErr(fl, "--relay-cache: %v", err)
		}
	}
	return node.RunConfig{
		Config: node.Config{
			RelayResumeWindow: *f.relayResumeWindow, RelayCache: relayCache,
			Flavor: o.flavor, API: *f.api, GatewayURL: *f.gatewayURL,
			Intents: *f.intents, Compression: o.compression, Backoff: o.backoff,
			MaxConcurrency: *f.maxConc, IdentifyTotal: *f.idTotal, IdentifyReserve: *f.idReserve,
			ResumeWindow: *f.resumeWindow, Etcd: etcdCfg, MetricsListen: *f.metricsListen,
		},
		Total: o.total, Shards: o.shards,
		Listen: listen, ListenOptional: optional, TLS: f.tlsFiles(), MaxConns: *f.maxConns, IdleTimeout: f.idle(),
		SessionsDir: *f.sessions, Relay: f.relays,
	}, nil
}

// tlsFiles are the tls! listeners' files, the deny list included.
func (f *serveFlags) tlsFiles() fsrv.TLSFiles {
	files := f.tls.files()
	files.Deny = *f.tlsDeny
	return files
}

// idle is --idle-timeout for fsrv: 0 there is the default, never is
// negative.
func (f *serveFlags) idle() time.Duration {
	if *f.idleTimeout == 0 {
		return -1
	}
	return *f.idleTimeout
}

// listenAddrs are the --listen addresses; without any, serve's
// defaults, the loopback TCP one optional: another local user may hold
// its port, and that must not stop the node (the unix socket serves the
// operator). A listener given with --listen that cannot open fails the
// start.
func (f *serveFlags) listenAddrs() (listen, optional []string) {
	if len(f.listens) == 0 {
		d := serveListeners()
		return d[:1], d[1:]
	}
	return f.listens, nil
}

// hasTLSListener reports whether the listeners include a tls! one.
func (f *serveFlags) hasTLSListener() bool {
	for _, a := range f.listens {
		if la, err := fsrv.ParseListenAddr(a); err == nil && la.TLS {
			return true
		}
	}
	return false
}

// serveOpts are the checked values of serveFlags.
type serveOpts struct {
	flavor      core.Flavor
	compression gateway.Compression
	backoff     core.BackoffPolicy
	total       int   // 0 for auto
	shards      []int // nil for all of the total
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
	if *f.idleTimeout < 0 {
		return o, flagErr(fl, "--idle-timeout %v: want 0 (never) or more", *f.idleTimeout)
	}
	if *f.tlsDeny != "" && !f.hasTLSListener() {
		// It would be read by nothing: an operator who believes a
		// certificate is revoked must hear that it is not.
		return o, flagErr(fl, "--tls-deny %s: no tls! listener to apply it to (give --listen tls!HOST!PORT)", *f.tlsDeny)
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
	if *f.shards != "" {
		if o.shards, err = core.ParseShardList(*f.shards); err != nil {
			return o, flagErr(fl, "--shards: %v", err)
		}
	}
	if o.total != 0 {
		if _, err := node.Plan(o.total, o.shards); err != nil {
			return o, flagErr(fl, "%v", err)
		}
	}
	return o, nil
}
