package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/supervisor"
)

// runSupervise runs children (serve, this binary) that own blocks of the
// shards, restarts them under the restart policy, and serves one tree for
// all of them (supervisor.Run). Child ID's sessions folder is
// --sessions DIR/ID, or one in a private temporary folder.
func runSupervise(ctx context.Context, args []string, stderr io.Writer) error {
	fl := flag.NewFlagSet("supervise", flag.ContinueOnError)
	fl.SetOutput(stderr)
	// serve's flags, one definition: --listen, --tls-*, --max-conns and
	// --token-file are the parent's; --sessions DIR gives child ID the
	// folder DIR/ID (default: a private temporary folder); the identify
	// flags set the shared pacer; the gateway's flags go on to every child
	// as given. --shards and the etcd flags are refused.
	var f serveFlags
	f.register(fl)
	// The children.
	processes := fl.Int("processes", 0, "run N children with contiguous blocks of shards")
	perProcess := fl.Int("shards-per-process", 0, "run children of K shards each")
	assign := fl.String("assign", "", "named blocks: 'a=0-3;b=4-7' (gaps allowed: those shards run nowhere)")
	pol := supervisor.DefaultPolicy
	fl.IntVar(&pol.MaxAttempts, "restart-max", pol.MaxAttempts, "restarts in a row of a child that exits unexpectedly before the supervisor fails (0: the first exit fails it)")
	fl.DurationVar(&pol.MinDelay, "restart-min-delay", pol.MinDelay, "delay before the first restart, doubling with each attempt")
	fl.DurationVar(&pol.MaxDelay, "restart-max-delay", pol.MaxDelay, "longest restart delay")
	fl.DurationVar(&pol.HealthyReset, "healthy-reset", pol.HealthyReset, "a child running that long gets its restart budget back")
	fl.DurationVar(&pol.StartupTimeout, "startup-timeout", pol.StartupTimeout, "time a child has to serve its tree after its start")
	fl.DurationVar(&pol.ShutdownTimeout, "shutdown-timeout", pol.ShutdownTimeout, "time a child has to exit after SIGTERM before SIGKILL (the default covers a clean stop, up to about 17 s)")
	fl.DurationVar(&pol.Watchdog, "watchdog", pol.Watchdog, "a running child silent on its channel that long is hung: killed and restarted (0: off)")
	fl.BoolVar(&pol.FailAll, "fail-all", false, "a child that uses up its restarts stops every child and supervise exits 1 (default: that child alone is failed)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	var refused string
	fl.Visit(func(v *flag.Flag) {
		switch {
		case refused != "":
		case v.Name == "shards":
			refused = "--shards: supervise gives each child its block: use --processes, --shards-per-process or --assign"
		case v.Name == "metrics-listen":
			refused = "--metrics-listen: supervise does not serve /metrics over HTTP yet; read /metrics of its tree (every child's, labelled child=ID)"
		case strings.HasPrefix(v.Name, "relay"):
			refused = "--" + v.Name + ": supervise does not run the gateway relay yet (each child would need its own address); run serve --relay"
		case etcdFlagNames()[v.Name]:
			refused = fmt.Sprintf("--%s: supervise with etcd is not supported yet (the children would each join the fleet as a node of their own); run serve --etcd on each node instead", v.Name)
		}
	})
	if refused != "" {
		return flagErr(fl, "%s", refused)
	}
	o, err := f.check(fl)
	if err != nil {
		return err
	}
	ways := 0
	for _, set := range []bool{*processes != 0, *perProcess != 0, *assign != ""} {
		if set {
			ways++
		}
	}
	if ways != 1 {
		return flagErr(fl, "want exactly one of --processes N, --shards-per-process K, --assign 'a=0-3;b=4-7'")
	}
	switch {
	case pol.MaxAttempts < 0:
		return flagErr(fl, "--restart-max %d: want 0 or more", pol.MaxAttempts)
	case pol.MinDelay <= 0 || pol.MaxDelay < pol.MinDelay:
		return flagErr(fl, "--restart-min-delay %v, --restart-max-delay %v: want 0 < min <= max", pol.MinDelay, pol.MaxDelay)
	case pol.HealthyReset <= 0 || pol.StartupTimeout <= 0 || pol.ShutdownTimeout <= 0:
		return flagErr(fl, "--healthy-reset, --startup-timeout and --shutdown-timeout must be positive")
	case pol.Watchdog != 0 && pol.Watchdog < 2*time.Second:
		return flagErr(fl, "--watchdog %v: want 0 (off) or at least 2s (a child reports every second)", pol.Watchdog)
	}
	listen, optional := f.listenAddrs()
	rc := supervisor.RunConfig{
		Pacing: gateway.Pacing{Flavor: o.flavor, MaxConcurrency: *f.maxConc, IdentifyTotal: *f.idTotal,
			IdentifyReserve: *f.idReserve, Fixed: *f.gatewayURL != ""},
		API: *f.api, Total: o.total,
		Processes: *processes, ShardsPerProcess: *perProcess, Assign: *assign, Policy: pol,
		Listen: listen, ListenOptional: optional, TLS: f.tlsFiles(), MaxConns: *f.maxConns, IdleTimeout: f.idle(),
		SessionsDir: *f.sessions, Env: childEnv(),
	}
	if o.total != 0 {
		if _, err := rc.AssignmentFor(o.total); err != nil {
			return flagErr(fl, "%v", err)
		}
	}
	// The gateway's flags go on to every child as the operator gave them
	// (checked above, so that a bad one fails the parent, not every
	// child in turn).
	fl.Visit(func(v *flag.Flag) {
		switch v.Name {
		case "api", "gateway", "intents", "compress", "backoff", "resume-window", "debug":
			rc.PassOn = append(rc.PassOn, "--"+v.Name+"="+v.Value.String())
		}
	})
	if rc.Token, err = readToken(*f.tokenFile); err != nil {
		return err
	}
	log, _, stopLog := newLogger(stderr, *f.debug)
	defer stopLog()
	rc.Logger, rc.Output = log, stderr
	return supervisor.Run(ctx, rc)
}

// childEnv is the environment without the token (readToken re-executed
// the parent without it; this is for a parent that was given both).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHARDFS_TOKEN=") && !strings.HasPrefix(kv, tokenFDVar+"=") {
			env = append(env, kv)
		}
	}
	return env
}
