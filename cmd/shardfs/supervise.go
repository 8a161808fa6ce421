package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/sessions/dir"
	"github.com/shardfs/shardfs/supervisor"
)

// runSupervise runs children (serve, this binary) that own blocks of the
// shards, restarts them under the restart policy, and serves one tree for
// all of them (DESIGN.md section 7.4; package supervisor).
//
// Each child gets its own sessions folder, --sessions DIR/ID (or one in a
// private temporary folder when --sessions is not given), so that a
// restart resumes its shards; and a unix socket in a private temporary
// folder, where the parent reaches its tree.
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
	fl.DurationVar(&pol.ShutdownTimeout, "shutdown-timeout", pol.ShutdownTimeout, "time a child has to exit after SIGTERM before SIGKILL")
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
	flavor, total := o.flavor, o.total
	api, gatewayURL, totalFlag, sessDir, debug := f.api, f.gatewayURL, f.total, f.sessions, f.debug
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
	}
	if *totalFlag != "auto" {
		if _, err := assignment(total, *processes, *perProcess, *assign); err != nil {
			return flagErr(fl, "%v", err)
		}
	}
	// The gateway's flags go on to every child as the operator gave them
	// (checked above, so that a bad one fails the parent, not every
	// child in turn).
	var passed [][2]string
	fl.Visit(func(v *flag.Flag) {
		switch v.Name {
		case "api", "gateway", "intents", "compress", "backoff", "resume-window", "debug":
			passed = append(passed, [2]string{v.Name, v.Value.String()})
		}
	})
	token, err := readToken(*f.tokenFile)
	if err != nil {
		return err
	}
	ls, err := listen(f.listens, serveListeners(), &f.tls)
	if err != nil {
		return err
	}
	defer closeListeners(ls)
	log, _, stopLog := newLogger(stderr, *debug)
	defer stopLog()

	var limit *core.StartLimit
	if *totalFlag == "auto" || (flavor == core.Discord && *gatewayURL == "") {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		disc, err := gateway.Discover(dctx, nil, flavor, *api, token)
		cancel()
		switch {
		case err != nil && *totalFlag == "auto":
			return fmt.Errorf("--total auto: %w", err)
		case err != nil:
			log.Error("discovery before the start failed: the identify budget is unknown until a child's shard discovers and reports it", "err", err)
		default:
			limit = &disc.StartLimit
			if *totalFlag == "auto" {
				total = disc.Shards
				log.Info("discovered the recommended shard count", "total", total)
			}
		}
	}
	a, err := assignment(total, *processes, *perProcess, *assign)
	if err != nil {
		return flagErr(fl, "%v", err)
	}
	if len(a.Unowned) > 0 {
		log.Warn("some shards of the total are in no child's block: they run nowhere here", "unowned", supervisor.FormatShards(a.Unowned))
	}

	// The shared pacer: the children identify as one node would.
	var pacer *core.Pacer
	if flavor == core.Fluxer {
		pacer = core.NewFluxerPacer(nil, core.DefaultFluxerPacing)
	} else {
		pacer = core.NewDiscordPacer(nil, *f.maxConc)
		if *f.idReserve != -1 {
			pacer.SetReserve(*f.idReserve)
		}
		lt := *f.idTotal
		if lt == 0 && *gatewayURL != "" {
			lt = core.DiscordStartTotal
		}
		pacer.LimitTotal(lt)
		if limit != nil {
			pacer.SetStartLimit(*limit)
		}
	}

	run, err := os.MkdirTemp("", "shardfs-supervise-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(run)
	sessions := *sessDir
	if sessions == "" {
		sessions = filepath.Join(run, "sessions")
	}
	if err := os.MkdirAll(sessions, 0o700); err != nil {
		return fmt.Errorf("--sessions: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// A child's socket is named by its block's index, not its ID: the
	// parent dials the full path, which must fit sun_path (108 bytes)
	// whatever the ID (up to 128 characters) and the temporary folder.
	index := map[string]int{}
	for i, b := range a.Blocks {
		index[b.ID] = i
	}
	childArgs := func(l supervisor.Launch) []string {
		args := []string{"serve", "--flavor", flavor.String(), "--total", strconv.Itoa(total),
			"--shards", supervisor.FormatShards(l.Shards),
			"--listen", "unix!" + filepath.Join(run, strconv.Itoa(index[l.ID])+".sock"),
			"--sessions", filepath.Join(sessions, l.ID),
			"--max-concurrency", strconv.Itoa(pacer.MaxConcurrency()),
		}
		for _, kv := range passed {
			args = append(args, "--"+kv[0]+"="+kv[1])
		}
		return args
	}
	out := supervisor.NewOutput(stderr)
	ex := &supervisor.Exec{Path: self, Args: childArgs, Env: childEnv(), Token: token, Pacer: supervisor.NewSpacedPacer(pacer, flavor == core.Discord, nil), Output: out}
	var tree *supervisor.Tree // set below, before the first launch
	launch := func(l supervisor.Launch, r *supervisor.Reports) (supervisor.Process, error) {
		if l.Crashed {
			folder := filepath.Join(sessions, l.ID)
			dropSnapshots(folder, l.Shards, log)
			if flavor == core.Discord {
				resumeCrashed(tree, l.ID, folder, flavor, total, log)
			}
		}
		return ex.Launch(l, r)
	}
	sup := supervisor.New(supervisor.Config{Assignment: a, Policy: pol, Launch: launch, Logger: log.With("component", "supervisor")})
	tree = supervisor.NewTree(supervisor.TreeConfig{
		Supervisor: sup, Assignment: a, Flavor: flavor, Identify: pacer.Budget,
		Info: func() [][2]string {
			return [][2]string{{"max_concurrency", strconv.Itoa(pacer.MaxConcurrency())}}
		},
		Logger: log.With("component", "tree"),
	})
	ex.Lines, ex.Sessions = tree.Line, tree.Session
	if flavor == core.Discord {
		// What the children's discoveries learn reaches the shared
		// pacer: it lowers what remains, never raises it.
		ex.Limits = func(_ string, l core.StartLimit) { pacer.SetStartLimit(l) }
	}
	srv := &fsrv.Server{Root: tree.Root(), Logger: log.With("component", "9p"), MaxConns: *f.maxConns}
	for _, l := range ls {
		log.Info("serving the tree over 9P", "addr", addrString(l.l), "access", l.access())
	}
	log.Info("starting children", "children", len(a.Blocks), "total", total)
	sup.Start()

	sctx, stopServing := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() {
			if err := srv.Serve(sctx, l.l); err != nil && !errors.Is(err, fsrv.ErrServerClosed) {
				log.Error("serving 9P", "addr", addrString(l.l), "err", err)
			}
		})
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down: stopping every child, each saving its sessions")
	case <-sup.Done():
	}
	sup.Close()
	ex.Wait()
	out.Close()
	stopServing()
	srv.Close()
	wg.Wait()
	tree.Close()
	if err := sup.Err(); err != nil {
		return err
	}
	log.Info("every child stopped")
	return nil
}

func assignment(total, processes, perProcess int, assign string) (supervisor.Assignment, error) {
	switch {
	case processes != 0:
		return supervisor.ByProcesses(total, processes)
	case perProcess != 0:
		return supervisor.ByShardsPerProcess(total, perProcess)
	}
	return supervisor.ParseAssign(total, assign)
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

// dropSnapshots removes the snapshots of a child that crashed or was
// killed: what it saved, if anything, may be past the last line the
// parent got, and a resume from there would skip what the parent never
// saw (a killed stop saves some shards, not all). Its shards start new
// sessions, or resume from the parent's points (resumeCrashed). The file
// name is sessions/dir's (shard-N.json).
func dropSnapshots(folder string, shards []int, log *slog.Logger) {
	for _, id := range shards {
		p := filepath.Join(folder, "shard-"+strconv.Itoa(id)+".json")
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Error("cannot remove a crashed child's snapshot: its shard may resume past what the parent has", "file", p, "err", err)
		}
	}
}

// resumeCrashed writes, into a crashed child's sessions folder, a
// snapshot of each of its shards' sessions at the last sequence the
// parent's /dispatch holds, so that the next child resumes them and the
// gateway replays, once, what the parent had not seen (package
// supervisor's doc says when this is safe). Discord only: Fluxer trims
// its replay buffer to the sequence the child's heartbeats acknowledged,
// which may be past the parent's, and refuses such a resume.
func resumeCrashed(tree *supervisor.Tree, id, folder string, flavor core.Flavor, total int, log *slog.Logger) {
	points := tree.ResumePoints(id)
	if len(points) == 0 {
		return
	}
	store, err := dir.Open(folder, dir.Options{Logger: log})
	if err != nil {
		log.Error("cannot resume the crashed child's sessions: its shards start new ones", "child", id, "err", err)
		return
	}
	defer store.Close()
	now := time.Now()
	saved := 0
	for _, p := range points {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := store.Save(ctx, p.Shard, core.Snapshot{Flavor: flavor, Session: p.Session, Sequence: p.Sequence, Total: total, SavedAt: now})
		cancel()
		if err != nil {
			log.Error("saving a crashed child's session failed: that shard starts a new one", "child", id, "shard", p.Shard, "err", err)
			continue
		}
		saved++
	}
	log.Info("the crashed child's shards resume from the last sequence the parent has", "child", id, "shards", saved)
}
