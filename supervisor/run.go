package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/sessions/dir"
)

// RunConfig configures Run: what supervise's flags say, checked.
type RunConfig struct {
	// Pacing is the shared pacer's (serve's identify flags); its Flavor
	// is the children's.
	Pacing gateway.Pacing
	// Token is the bot token, which the children get on their channel.
	Token string
	// API is the HTTP API base for discovery.
	API string
	// Total is the plan's total; 0 means auto, discovery's
	// recommendation.
	Total int
	// Exactly one of Processes, ShardsPerProcess and Assign says the
	// children's blocks (see ByProcesses, ByShardsPerProcess, ParseAssign).
	Processes, ShardsPerProcess int
	Assign                      string
	Policy                      Policy
	// Listen are the parent tree's 9P listeners, TLS the files its tls!
	// ones serve with, MaxConns the connections served at once.
	Listen   []string
	TLS      fsrv.TLSFiles
	MaxConns int
	// ListenOptional are listeners opened beside Listen when they can
	// be (see node.RunConfig.ListenOptional).
	ListenOptional []string
	// IdleTimeout closes a TCP or TLS connection of the parent's tree
	// with no request for that long (0: fsrv's default; negative: never).
	IdleTimeout time.Duration
	// SessionsDir, when set, holds child ID's sessions folder, ID;
	// otherwise each child's is in a private temporary folder.
	SessionsDir string
	// Path is the binary the children run as serve (default: this one);
	// Env their environment, which must not hold the token.
	Path string
	Env  []string
	// PassOn are serve's flags given to every child as the operator gave
	// them ("--name=value").
	PassOn []string
	Logger *slog.Logger
	// Output receives the children's output, each line labelled.
	Output io.Writer
}

// AssignmentFor is the children's blocks of total: by Processes,
// ShardsPerProcess or Assign, whichever is set.
func (rc RunConfig) AssignmentFor(total int) (Assignment, error) {
	switch {
	case rc.Processes != 0:
		return ByProcesses(total, rc.Processes)
	case rc.ShardsPerProcess != 0:
		return ByShardsPerProcess(total, rc.ShardsPerProcess)
	}
	return ParseAssign(total, rc.Assign)
}

// Run runs children (serve) that own blocks of the shards, restarts
// them under the restart policy, and serves one tree for all of them,
// until ctx ends or the supervisor fails (DESIGN.md section 7.4).
//
// Each child gets its own sessions folder, so that a restart resumes its
// shards; and a unix socket in a private temporary folder, where the
// parent reaches its tree. The children identify as one node would,
// through one shared pacer.
func Run(ctx context.Context, rc RunConfig) error {
	// A dead reader of the parent's own stderr (`supervise | tee` with tee
	// gone) must not kill the parent, and with it every child's shard: a
	// log line to a broken pipe is lost, nothing else.
	signal.Ignore(syscall.SIGPIPE)
	log := rc.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rc.SessionsDir != "" {
		release, err := lockSessions(rc.SessionsDir)
		if err != nil {
			return err
		}
		defer release()
	}
	ls, err := fsrv.Open(rc.Listen, rc.TLS)
	if err != nil {
		return err
	}
	defer ls.Close()
	ls.OpenOptional(rc.ListenOptional, log)
	flavor := rc.Pacing.Flavor
	total, limit, err := rc.discover(ctx, log)
	if err != nil {
		return err
	}
	a, err := rc.AssignmentFor(total)
	if err != nil {
		return err
	}
	if len(a.Unowned) > 0 {
		log.Warn("some shards of the total are in no child's block: they run nowhere here", "unowned", FormatShards(a.Unowned))
	}
	if rc.SessionsDir != "" {
		bound := rc.Policy.ShutdownTimeout
		if bound <= 0 {
			bound = DefaultPolicy.ShutdownTimeout
		}
		if err := waitChildFolders(ctx, rc.SessionsDir, a, bound, log); err != nil {
			return err
		}
	}
	pacer := gateway.NewPacer(nil, rc.Pacing)
	if limit != nil && flavor == core.Discord {
		pacer.SetStartLimit(*limit)
	}

	tmp, err := os.MkdirTemp("", "shardfs-supervise-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ex, sessions, err := rc.newExec(tmp, a, total, pacer)
	if err != nil {
		return err
	}
	if rc.SessionsDir != "" && flavor == core.Discord {
		keepIdentifyTimes(ex.Pacer.(*SpacedPacer), rc.SessionsDir, log)
	}
	var tree *Tree // set below, before the first launch
	launch := func(l Launch, r *Reports) (Process, error) {
		if l.Crashed {
			folder := filepath.Join(sessions, l.ID)
			dropSnapshots(folder, l.Shards, log)
			if flavor == core.Discord {
				resumeCrashed(tree, l.ID, folder, flavor, total, log)
			}
		}
		return ex.Launch(l, r)
	}
	sup := New(Config{Assignment: a, Policy: rc.Policy, Launch: launch, Logger: log.With("component", "supervisor")})
	tree = NewTree(TreeConfig{
		Supervisor: sup, Assignment: a, Flavor: flavor, Identify: pacer.Budget,
		Info: func() [][2]string {
			return [][2]string{{"max_concurrency", strconv.Itoa(pacer.MaxConcurrency())}}
		},
		Logger: log.With("component", "tree"),
	})
	ex.Lines, ex.Sessions, ex.States = tree.Line, tree.Session, tree.State
	ex.Logger = log.With("component", "channel")
	if flavor == core.Discord {
		ex.Limits = childLimits(pacer, limit, log)
	}
	srv := &fsrv.Server{Root: tree.Root(), Logger: log.With("component", "9p"), IdleTimeout: rc.IdleTimeout}
	// A child holds a few pipes and its channel's socket here.
	srv.MaxConns = fsrv.FitMaxConns(log, rc.MaxConns, 8*len(a.Blocks))
	ls.Log(log)
	if ls.HasTLS() {
		defer ls.ReloadOnHangup(log)()
	}
	log.Info("starting children", "children", len(a.Blocks), "total", total)
	sup.Start()

	stopServing := serve(srv, ls, log)
	select {
	case <-ctx.Done():
		log.Info("shutting down: stopping every child, each saving its sessions")
	case <-sup.Done():
	}
	sup.Close()
	ex.Wait()
	ex.Output.Close()
	stopServing()
	tree.Close()
	if err := sup.Err(); err != nil {
		return err
	}
	log.Info("every child stopped")
	return nil
}

// newExec is how the children start: serve, with a block of the shards, a
// sessions folder each under sessions (SessionsDir, or one in tmp) and a
// socket each in tmp.
func (rc RunConfig) newExec(tmp string, a Assignment, total int, pacer *core.Pacer) (*Exec, string, error) {
	sessions := rc.SessionsDir
	if sessions == "" {
		sessions = filepath.Join(tmp, "sessions")
	}
	if err := os.MkdirAll(sessions, 0o700); err != nil {
		return nil, "", fmt.Errorf("--sessions: %w", err)
	}
	self := rc.Path
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, "", err
		}
	}
	// A child's socket is named by its block's index, not its ID: the
	// parent dials the full path, which must fit sun_path (108 bytes)
	// whatever the ID (up to 128 characters) and the temporary folder.
	index := map[string]int{}
	for i, b := range a.Blocks {
		index[b.ID] = i
	}
	childArgs := func(l Launch) []string {
		args := []string{"serve", "--flavor", rc.Pacing.Flavor.String(), "--total", strconv.Itoa(total),
			"--shards", FormatShards(l.Shards),
			"--listen", "unix!" + filepath.Join(tmp, strconv.Itoa(index[l.ID])+".sock"),
			"--sessions", filepath.Join(sessions, l.ID),
			"--max-concurrency", strconv.Itoa(pacer.MaxConcurrency()),
		}
		return append(args, rc.PassOn...)
	}
	discord := rc.Pacing.Flavor == core.Discord
	ex := &Exec{Path: self, Args: childArgs, Env: rc.Env, Token: rc.Token, Pacer: NewSpacedPacer(pacer, discord, nil), Output: NewOutput(rc.Output)}
	return ex, sessions, nil
}

// keepIdentifyTimes spaces the first identifies from those a predecessor
// (a supervise killed, whose children then saved and exited) wrote, and
// saves every write reported, beside the children's sessions folders: a
// new process does not know its predecessor's identifies otherwise, and
// the gateway refuses (op 9) an identify 5 s too close to the last of
// its bucket, whoever sent it.
func keepIdentifyTimes(sp *SpacedPacer, folder string, log *slog.Logger) {
	prev, err := dir.LoadIdentifyTimes(folder)
	if err != nil {
		log.Warn("the last identify times cannot be read: the first identifies are spaced from nothing", "err", err)
	}
	sp.Seed(prev.Floor)
	var mu sync.Mutex // one save at a time, each of the latest writes
	sp.OnWritten(func() {
		mu.Lock()
		defer mu.Unlock()
		mc, written := sp.Writes()
		if err := dir.SaveIdentifyTimes(folder, dir.IdentifyTimes{MaxConcurrency: mc, Written: written}); err != nil {
			log.Warn("saving the last identify times", "err", err)
		}
	})
}

// childLimits is what the parent does with a child's limit report. With
// no discovery of its own, what the children's discoveries learn reaches
// the shared pacer (it lowers what remains, never raises it). With its
// own discovery (own non-nil) the parent ignores them: one child's
// figure would set every child's pacing, a plausible max_concurrency of
// 1 slowing the whole tree or of 64 making the others' identifies fail,
// a remaining of 0 with a day's reset stopping every identify (the
// re-attack on issue 23); the parent counts its own grants from its
// discovery instead.
func childLimits(pacer *core.Pacer, own *core.StartLimit, log *slog.Logger) func(string, core.StartLimit) {
	return func(child string, l core.StartLimit) {
		if own != nil {
			log.Debug("a child's identify limit ignored: the parent's own discovery paces the tree", "child", child, "max_concurrency", l.MaxConcurrency, "remaining", l.Remaining)
			return
		}
		pacer.SetStartLimit(l)
	}
}

// discover runs discovery before the start: with Total 0 for the
// recommended count, and for Discord the session start limit the shared
// pacer must know before the first child identifies.
func (rc RunConfig) discover(ctx context.Context, log *slog.Logger) (total int, limit *core.StartLimit, err error) {
	total = rc.Total
	if total != 0 && (rc.Pacing.Flavor != core.Discord || rc.Pacing.Fixed) {
		return total, nil, nil
	}
	d, ok, err := gateway.DiscoverBeforeStart(ctx, rc.Pacing.Flavor, rc.API, rc.Token, total == 0, log,
		"the identify budget is unknown until a child's shard discovers and reports it")
	if !ok {
		return total, nil, err
	}
	if total == 0 {
		total = d.Shards
	}
	return total, &d.StartLimit, nil
}

// serve serves the tree on every listener; stop stops serving and waits
// for the connections.
func serve(srv *fsrv.Server, ls *fsrv.Listeners, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range ls.List {
		wg.Go(func() {
			if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, fsrv.ErrServerClosed) {
				log.Error("serving 9P", "addr", fsrv.AddrString(l), "err", err)
			}
		})
	}
	return func() {
		cancel()
		srv.Close()
		wg.Wait()
	}
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
// gateway replays, once, what the parent had not seen (the package doc
// says when this is safe). Discord only: Fluxer trims its replay buffer
// to the sequence the child's heartbeats acknowledged, which may be past
// the parent's, and refuses such a resume.
func resumeCrashed(tree *Tree, id, folder string, flavor core.Flavor, total int, log *slog.Logger) {
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
