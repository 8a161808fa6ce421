package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// Kind is a kind of fault.
type Kind string

// The faults the soak injects.
const (
	Kill      Kind = "kill"      // SIGKILL of a node, then a restart
	Pause     Kind = "pause"     // SIGSTOP of a node past the TTL, then SIGCONT
	Partition Kind = "partition" // the node's way to etcd cut past the TTL, then healed
	EtcdKill  Kind = "etcd"      // SIGKILL of etcd, then a restart on the same data
	Drain     Kind = "drain"     // drain on the node's /ctl, then a restart

	// With a cluster of three etcd members (Config.EtcdMembers): faults
	// that leave etcd a quorum, each held for 2 × TTL.
	MemberKill      Kind = "member"           // SIGKILL of a member that does not lead, then a restart
	LeaderKill      Kind = "leader"           // SIGKILL of the leader (a leader change), then a restart
	MemberPartition Kind = "member-partition" // a member that does not lead cut off from the others, then healed
	LeaderPartition Kind = "leader-partition" // the leader cut off from the others (a leader change), then healed
)

// Kinds are the faults drawn by default, in the order the report lists
// them.
var Kinds = []Kind{Kill, Pause, Partition, EtcdKill, Drain}

// ClusterKinds are the faults of an etcd member; they need
// Config.EtcdMembers of 3 or more.
var ClusterKinds = []Kind{MemberKill, LeaderKill, MemberPartition, LeaderPartition}

// quorate reports whether a fault of kind k leaves etcd a quorum: then
// nothing may be lost, duplicated or re-identified.
func quorate(k Kind) bool { return slices.Contains(ClusterKinds, k) }

// Config sizes a soak.
type Config struct {
	Faults int           // faults injected, kinds in turn in a shuffled order; default 20
	Nodes  int           // serve processes; default 3
	Shards int           // the plan's total; default 16
	TTL    time.Duration // --etcd-ttl; default 3 s
	// EtcdMembers is the size of the etcd cluster, child processes;
	// default 1. ClusterKinds need 3 or more.
	EtcdMembers int
	Seed        uint64 // the fault schedule; 0 means 1
	Kinds       []Kind // the kinds drawn from; nil means Kinds

	Serve string // the shardfs binary
	Exe   string // a binary that calls MaybeRunEtcd first (the test binary, bench)
	Dir   string // scratch folder (etcd's data)

	Log     io.Writer // one line per fault; nil discards
	Verbose bool      // the nodes' logs on Log too

	// HangBound is how long Run waits for the cluster to converge after
	// a fault or a repair before it gives up; zero means Bound, so that
	// a fault past the bound fails the run (the soak of bench/). A test
	// on a shared, loaded machine sets it higher: convergence is still
	// required and every failover still measured, and Report.OverBound
	// counts those that took longer than Bound, instead of a busy
	// machine's slow start failing the test.
	HangBound time.Duration
}

func (c Config) withDefaults() Config {
	if c.Faults <= 0 {
		c.Faults = 20
	}
	if c.Nodes <= 0 {
		c.Nodes = 3
	}
	if c.Shards <= 0 {
		c.Shards = 16
	}
	if c.TTL <= 0 {
		c.TTL = 3 * time.Second
	}
	if c.EtcdMembers <= 0 {
		c.EtcdMembers = 1
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if len(c.Kinds) == 0 {
		c.Kinds = Kinds
	}
	return c
}

// Bound is how long after a fault every shard must be READY on exactly one
// node: the TTL plus 10 s, issue 12's bound.
func (c Config) Bound() time.Duration { return c.TTL + 10*time.Second }

// hangBound is Config.HangBound, or Bound.
func (c Config) hangBound() time.Duration { return max(c.HangBound, c.Bound()) }

// HeartbeatInterval is the simulator's: TTL/4, so that a paused node's
// sessions turn quiet (QuietAfter, 1.5 intervals after their last frame)
// before that node's lease can expire (at least TTL − TTL/3 after the
// pause) and let another node in; see the package doc.
func (c Config) HeartbeatInterval() time.Duration { return c.TTL / 4 }

// QuietAfter is the simulator's: a session whose client sent nothing for
// 1.5 heartbeat intervals leaves LiveSessions, and its next frame counts
// it again.
func (c Config) QuietAfter() time.Duration { return c.HeartbeatInterval() * 3 / 2 }

// HeartbeatTimeout is the simulator's, Discord's 1.5 × 41.25 s: a paused
// node's connections stay open past the pause, as they would at Discord,
// so that a woken node writing on one would reach the simulator.
const HeartbeatTimeout = 41250 * time.Millisecond * 3 / 2

// token is the simulator's bot token; the soak checks it never reaches a
// node's log.
const token = "SOAK-TOKEN-never-in-a-log"

const bot = "soak"

// Run runs the soak. The error is a fault the cluster did not recover from
// within the bound or a harness failure; Report.Violations lists the
// broken invariants (a duplicate session, a frame for a shard not owned).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	c, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()
	rep := &Report{Config: cfg, Faults: map[Kind]int{}, Failover: map[Kind][]time.Duration{}, Recovery: map[Kind][]time.Duration{}, Sessions: map[Kind]Sessions{}}
	began := time.Now()
	if d, err := c.converge(ctx, nil, nil, cfg.hangBound()+20*time.Second); err != nil {
		return rep, fmt.Errorf("first start: %w", err)
	} else {
		fmt.Fprintf(cfg.Log, "start: every shard READY in %v\n", d.Round(time.Millisecond))
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 12))
	var kinds []Kind
	for len(kinds) < cfg.Faults {
		round := append([]Kind(nil), cfg.Kinds...)
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		kinds = append(kinds, round...)
	}
	for i, k := range kinds[:cfg.Faults] {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		n := c.nodes[rng.IntN(len(c.nodes))]
		f := fault{kind: k, node: n, n: i + 1, rng: rng}
		before := c.sim.Totals()
		err := c.inject(ctx, f, rep)
		after := c.sim.Totals()
		s := rep.Sessions[k]
		s.Identifies += after.Identifies - before.Identifies
		s.Resumes += after.Resumes - before.Resumes
		rep.Sessions[k] = s
		rep.Faults[k]++
		if quorate(k) && after.Identifies > before.Identifies {
			rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d (%s): %d identifies during a fault that left etcd a quorum; want none", i+1, k, after.Identifies-before.Identifies))
		}
		c.checkDuplicates(rep, f)
		if werr := c.owners.err(); werr != nil && err == nil {
			err = fmt.Errorf("harness: %w", werr)
		}
		if err != nil {
			rep.Duration = time.Since(began)
			c.finish(rep)
			return rep, fmt.Errorf("fault %d (%s %s): %w", f.n, k, n.Name, err)
		}
	}
	rep.Duration = time.Since(began)
	c.finish(rep)
	return rep, nil
}

// cluster is everything the soak runs.
type cluster struct {
	cfg     Config
	sim     *gatewaysim.Server
	etcd    *Cluster
	proxies map[string]proxySet // a node's way to each etcd member
	nodes   []*Process
	frames  *frameLog
	owners  *owners
	cli     *clientv3.Client
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	paused map[string]bool // nodes under SIGSTOP: never read
	// nodes is appended to only while starting, when the simulator may
	// already call pids; mu guards that.

	maxLive int64 // the simulator's MaxLiveSessions after the last check
}

func start(ctx context.Context, cfg Config) (c *cluster, err error) {
	c = &cluster{cfg: cfg, proxies: map[string]proxySet{}, paused: map[string]bool{}}
	started := c // the returns below set c to nil; close what was started
	defer func() {
		if err != nil {
			started.close()
		}
	}()
	if c.etcd, err = NewCluster(cfg.Exe, filepath.Join(cfg.Dir, "etcd"), cfg.EtcdMembers); err != nil {
		return nil, err
	}
	if err = c.etcd.Start(ctx); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		name := fmt.Sprintf("node%d", i+1)
		for _, ep := range c.etcd.Endpoints() {
			p, err := NewProxy(strings.TrimPrefix(ep, "http://"))
			if err != nil {
				return nil, err
			}
			c.proxies[name] = append(c.proxies[name], p)
		}
	}
	// The listener first, so that the frame log knows the simulator's
	// port before the first frame.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.frames = newFrameLog(portOf(ln.Addr().String()), c.pids)
	c.sim, err = gatewaysim.New(gatewaysim.Config{
		Listener:       ln,
		Flavor:         gatewaysim.Discord,
		Token:          token,
		Shards:         cfg.Shards,
		MaxConcurrency: cfg.Shards,
		// 100 faults can start more than Discord's 1,000 sessions a day;
		// the budget is not what the soak is about.
		SessionStartLimit: 1_000_000,
		HeartbeatInterval: cfg.HeartbeatInterval(),
		HeartbeatTimeout:  HeartbeatTimeout,
		QuietAfter:        cfg.QuietAfter(),
		Traffic:           gatewaysim.Traffic{PerShard: 2, PayloadSize: 200},
		OnFrame:           c.frames.add,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	// The watch's client reconnects within 300 ms of etcd's restart (gRPC's
	// default backoff would wait seconds), so that the times at which it
	// sees ownership change stay close to the changes; see ownSlack.
	c.cli, err = clientv3.New(clientv3.Config{
		Endpoints: c.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.5, MaxDelay: 300 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if c.owners, err = watchOwners(wctx, c.cli, "/shardfs/"+bot+"/", &c.wg); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		name := fmt.Sprintf("node%d", i+1)
		n := &Process{
			Name: name,
			bin:  cfg.Serve,
			args: []string{"serve", "--flavor", "discord", "--api", c.sim.APIURL(),
				"--total", strconv.Itoa(cfg.Shards), "--max-concurrency", strconv.Itoa(cfg.Shards),
				"--listen", "tcp!127.0.0.1!0", "--backoff", "fixed:500ms",
				"--etcd", c.proxies[name].urls(), "--bot", bot, "--node", name,
				"--etcd-ttl", cfg.TTL.String()},
			env: []string{"SHARDFS_TOKEN=" + token},
		}
		if cfg.Verbose {
			n.log = cfg.Log
		}
		c.mu.Lock()
		c.nodes = append(c.nodes, n)
		c.mu.Unlock()
		if err := n.Start(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// pids maps the running nodes' process ids to their names.
func (c *cluster) pids() map[int]string {
	c.mu.Lock()
	nodes := c.nodes
	c.mu.Unlock()
	out := map[int]string{}
	for _, n := range nodes {
		if pid := n.Pid(); pid != 0 {
			out[pid] = n.Name
		}
	}
	return out
}

func (c *cluster) close() {
	for _, n := range c.nodes {
		_ = n.Signal(syscall.SIGCONT)
		_ = n.Stop(syscall.SIGKILL, 10*time.Second)
	}
	if c.cancel != nil {
		c.cancel()
	}
	if c.cli != nil {
		c.cli.Close()
	}
	c.wg.Wait()
	for _, p := range c.proxies {
		p.Close()
	}
	if c.sim != nil {
		c.sim.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
}

func (c *cluster) setPaused(n *Process, p bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused[n.Name] = p
}

func (c *cluster) isPaused(n *Process) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused[n.Name]
}

// converge polls, at most for d, until every shard is READY on exactly one
// readable node and the simulator holds exactly one live session per
// shard; when members is set, also until every running node lists exactly
// those members and runs at least one READY shard (every member back and
// serving; the soak does not wait for the exact rendezvous share). It
// returns how long that took.
// A node in away (cut from etcd, draining) must run no shard at all: its
// shards count only once READY elsewhere.
func (c *cluster) converge(ctx context.Context, members []string, away *Process, d time.Duration) (time.Duration, error) {
	begin := time.Now()
	deadline := begin.Add(d)
	var last string
	for {
		ok, why := c.converged(members, away)
		if ok {
			return time.Since(begin), nil
		}
		last = why
		if time.Now().After(deadline) {
			return time.Since(begin), fmt.Errorf("not converged within %v: %s", d, last)
		}
		select {
		case <-ctx.Done():
			return time.Since(begin), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *cluster) converged(members []string, away *Process) (bool, string) {
	ready := make([][]string, c.cfg.Shards)
	for _, n := range c.nodes {
		if !n.Running() || c.isPaused(n) {
			continue
		}
		text, err := n.Read("status")
		if err != nil {
			return false, err.Error()
		}
		st, err := parseStatus(text)
		if err != nil {
			return false, fmt.Sprintf("%s: /status: %v", n.Name, err)
		}
		owned := 0
		for id, state := range st {
			if id < 0 || id >= c.cfg.Shards {
				return false, fmt.Sprintf("%s: /status names shard %d outside the plan", n.Name, id)
			}
			if n == away && (state == "READY" || state == "STARTING") {
				return false, fmt.Sprintf("%s still has shard %d %s", n.Name, id, state)
			}
			if state == "READY" {
				ready[id] = append(ready[id], n.Name)
				owned++
			}
		}
		if members != nil {
			text, err := n.Read("members")
			if err != nil {
				return false, err.Error()
			}
			if got := memberNames(text); strings.Join(got, " ") != strings.Join(members, " ") {
				return false, fmt.Sprintf("%s: /members %v; want %v", n.Name, got, members)
			}
			if owned == 0 {
				return false, n.Name + " owns no READY shard yet"
			}
		}
	}
	for id, on := range ready {
		if len(on) != 1 {
			return false, fmt.Sprintf("shard %d READY on %v", id, on)
		}
		if st := c.sim.Stats(id); st.LiveSessions != 1 {
			return false, fmt.Sprintf("shard %d has %d live sessions at the gateway", id, st.LiveSessions)
		}
	}
	return true, ""
}

// parseStatus reads /status: id state sequence reconnects latency_ms.
func parseStatus(text string) (map[int]string, error) {
	out := map[int]string{}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 5 {
			return nil, fmt.Errorf("line %q: want 5 fields", line)
		}
		id, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("line %q: %v", line, err)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("shard %d twice", id)
		}
		out[id] = f[1]
	}
	return out, nil
}

// memberNames reads /members (node shards), sorted.
func memberNames(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	sort.Strings(out)
	return out
}

func (c *cluster) allNames() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}

type fault struct {
	kind Kind
	node *Process
	n    int
	rng  *rand.Rand
}

// inject runs one fault and its repair, and checks the recovery of both.
func (c *cluster) inject(ctx context.Context, f fault, rep *Report) error {
	n, ttl, bound := f.node, c.cfg.TTL, c.cfg.hangBound()
	logf := func(format string, args ...any) {
		fmt.Fprintf(c.cfg.Log, "fault %d %s %s: %s\n", f.n, f.kind, n.Name, fmt.Sprintf(format, args...))
	}
	var failover time.Duration
	var err error
	var repaired time.Time // when the repair began: restart, SIGCONT, heal
	began := time.Now()
	// left records the placement once the fault has taken the node away.
	left := func() error {
		return c.awaitBalanced(ctx, rep, f, "leave", without(c.allNames(), n.Name), began, bound)
	}
	var wakeEnds map[string]int64 // /dispatch ends before a pause
	var stopped time.Time
	switch f.kind {
	case Kill:
		_ = n.Stop(syscall.SIGKILL, 10*time.Second)
		if failover, err = c.converge(ctx, nil, nil, bound); err != nil {
			return fmt.Errorf("after SIGKILL: %w", err)
		}
		if err := left(); err != nil {
			return err
		}
		repaired = time.Now()
		if err := n.Start(ctx); err != nil {
			return err
		}
	case Pause:
		if wakeEnds, err = c.dispatchEnds(); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		if err := n.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		stopped = time.Now()
		c.setPaused(n, true)
		failover, err = c.converge(ctx, nil, nil, bound)
		if err != nil {
			_ = n.Signal(syscall.SIGCONT)
			c.setPaused(n, false)
			return fmt.Errorf("while paused: %w", err)
		}
		if err := left(); err != nil {
			return err
		}
		// Paused past the TTL, whatever the failover took.
		if rest := ttl + time.Second - time.Since(stopped); rest > 0 {
			time.Sleep(rest)
		}
		rep.QuietAtWake += c.quietSessions()
		woke := time.Now()
		repaired = woke
		if err := n.Signal(syscall.SIGCONT); err != nil {
			return err
		}
		c.setPaused(n, false)
		defer c.checkWake(rep, f, woke)
	case Partition:
		c.proxies[n.Name].Cut()
		failover, err = c.converge(ctx, nil, n, bound)
		if err == nil {
			err = c.checkFenced(n)
		}
		if err == nil {
			err = left()
		}
		if err != nil {
			c.proxies[n.Name].Heal()
			return fmt.Errorf("while cut: %w", err)
		}
		repaired = time.Now()
		if err := c.proxies[n.Name].Heal(); err != nil {
			return err
		}
	case EtcdKill:
		settled, err := c.identifySlotsGone(ctx)
		if err != nil {
			return err
		}
		rep.Settle = append(rep.Settle, settled)
		c.etcd.Kill()
		down := ttl/2 + time.Duration(f.rng.Int64N(int64(ttl)))
		time.Sleep(down)
		repaired = time.Now()
		if err := c.etcd.Start(ctx); err != nil {
			return err
		}
		logf("etcd down %v", down.Round(time.Millisecond))
	case MemberKill, LeaderKill, MemberPartition, LeaderPartition:
		repaired, err = c.memberFault(ctx, rep, f, logf)
		if err != nil {
			return err
		}
	case Drain:
		if err := n.Write("ctl", "drain\n"); err != nil {
			return err
		}
		if failover, err = c.converge(ctx, nil, n, bound); err != nil {
			return fmt.Errorf("after drain: %w", err)
		}
		if err := c.checkDrained(n); err != nil {
			return err
		}
		if err := left(); err != nil {
			return err
		}
		if err := n.Stop(syscall.SIGTERM, bound); err != nil {
			return err
		}
		repaired = time.Now()
		if err := n.Start(ctx); err != nil {
			return err
		}
	}
	if f.kind != EtcdKill && !quorate(f.kind) {
		rep.Failover[f.kind] = append(rep.Failover[f.kind], failover)
		if failover > c.cfg.Bound() {
			rep.OverBound++
			logf("failover %v is over the bound of %v", failover.Round(time.Millisecond), c.cfg.Bound())
		}
	}
	// The bound runs from the repair: a restarted process's start counts.
	if _, err := c.converge(ctx, c.allNames(), nil, bound-time.Since(repaired)); err != nil {
		return fmt.Errorf("after the repair: %w", err)
	}
	back := time.Since(repaired)
	rep.Recovery[f.kind] = append(rep.Recovery[f.kind], back)
	if f.kind == EtcdKill || quorate(f.kind) {
		err = c.awaitBalanced(ctx, rep, f, "etcd", c.allNames(), began, bound)
	} else {
		err = c.awaitBalanced(ctx, rep, f, "join", c.allNames(), repaired, bound)
	}
	if err != nil {
		return err
	}
	if f.kind == Pause {
		if err := c.checkWakeDeliveries(rep, f, wakeEnds, stopped); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	if back > c.cfg.Bound() {
		rep.OverBound++
		logf("recovery %v is over the bound of %v", back.Round(time.Millisecond), c.cfg.Bound())
	}
	if f.kind == EtcdKill || quorate(f.kind) {
		logf("every member back and serving %v after etcd's restart began", back.Round(time.Millisecond))
	} else {
		logf("failover %v; every member back and serving %v after the repair began", failover.Round(time.Millisecond), back.Round(time.Millisecond))
	}
	return nil
}

// identifySlotsGone waits, at most a minute (etcd under load expired a
// 7 s lease past 15 s once), until no identify slot key
// (identify/<bucket>, a lease of about 7 s each) is left in etcd. etcd
// gives every lease its full TTL again when it restarts, so a slot taken
// just before the outage holds its bucket for that long after etcd is
// back; waiting for the slots of the previous recovery first makes the
// etcd fault one fault rather than a fault during a recovery. It returns
// how long it waited.
func (c *cluster) identifySlotsGone(ctx context.Context) (time.Duration, error) {
	begin := time.Now()
	for {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		dir := "/shardfs/" + bot + "/identify/"
		resp, err := c.cli.Get(gctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		slots := 0
		if err == nil {
			for _, kv := range resp.Kvs {
				// identify/starts is the day's counter, not a slot.
				if _, nerr := strconv.Atoi(strings.TrimPrefix(string(kv.Key), dir)); nerr == nil {
					slots++
				}
			}
		}
		if err == nil && slots == 0 {
			return time.Since(begin), nil
		}
		if time.Since(begin) > time.Minute {
			return time.Since(begin), fmt.Errorf("%d identify slot keys still in etcd after %v (%v)", slots, time.Since(begin).Round(time.Second), err)
		}
		select {
		case <-ctx.Done():
			return time.Since(begin), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkFenced: a node cut from etcd past its deadline runs no shard.
func (c *cluster) checkFenced(n *Process) error {
	text, err := n.Read("status")
	if err != nil {
		return err
	}
	st, err := parseStatus(text)
	if err != nil {
		return err
	}
	for id, state := range st {
		if state == "READY" || state == "STARTING" {
			return fmt.Errorf("%s, cut from etcd past its TTL, has shard %d %s", n.Name, id, state)
		}
	}
	return nil
}

// checkDrained: a drained node owns nothing.
func (c *cluster) checkDrained(n *Process) error {
	return c.checkFenced(n)
}

// quietSessions counts the sessions attached to a connection that the
// simulator does not count live: their client has been silent (QuietAfter).
func (c *cluster) quietSessions() int64 {
	var attached int64
	for id := range c.cfg.Shards {
		for _, s := range c.sim.Sessions(id) {
			if s.Live {
				attached++
			}
		}
	}
	return attached - c.sim.Totals().LiveSessions
}

// checkWake records the frames a node woken from SIGSTOP at woke sent for
// a shard it did not own when it sent them. It is stricter than the
// whole-run check on frames that name no shard (say a resume of a session
// the gateway has ended, on a connection that never named one): those
// count unless they are close frames, since a woken node owns nothing
// until it acquires a shard, and such a frame is what a node acting on its
// stale state would send.
func (c *cluster) checkWake(rep *Report, f fault, woke time.Time) {
	for _, fr := range c.frames.since(f.node.Name, woke) {
		rep.WakeFrames++
		bad := !c.owned(fr)
		if fr.shard < 0 && fr.op != gatewaysim.OpClose {
			bad = true
		}
		if bad {
			rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d: %s, woken from SIGSTOP at %s, sent a frame for a shard it did not own: %s", f.n, f.node.Name, woke.Format("15:04:05.000"), fr))
		}
	}
}

// ownSlack is how far a frame may precede the watch event that shows its
// sender acquiring the shard: the node creates the key, then connects and
// sends; the test's watch sees the creation a little later.
const ownSlack = time.Second

// A close frame gets the slack on both sides: a planned move sends it
// before deleting the key, but the simulator may read it after the watch
// has seen the deletion (the first 100-fault run found one such close,
// 4000 on a move at startup, on a loaded machine); a close ends a session
// and cannot make a duplicate. Every other frame must come while the
// sender owns the shard, or just before the watch shows it acquiring it.
func (c *cluster) owned(fr sentFrame) bool {
	if fr.op == gatewaysim.OpClose {
		if fr.reply {
			return true // the closing handshake the gateway started
		}
		return c.owners.ownedBetween(fr.node, fr.shard, fr.at.Add(-ownSlack), fr.at.Add(ownSlack))
	}
	return c.owners.ownedBetween(fr.node, fr.shard, fr.at, fr.at.Add(ownSlack))
}

// checkDuplicates records a shard that ever had two live sessions, with
// the fault during which it happened.
func (c *cluster) checkDuplicates(rep *Report, f fault) {
	tot := c.sim.Totals()
	if tot.MaxLiveSessions > c.maxLive {
		c.maxLive = tot.MaxLiveSessions
		if c.maxLive > 1 {
			var which []string
			for id, st := range c.sim.AllStats() {
				if st.MaxLiveSessions > 1 {
					which = append(which, fmt.Sprintf("shard %d: %d", id, st.MaxLiveSessions))
				}
			}
			sort.Strings(which)
			rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d (%s %s): two live sessions for one shard (%s)", f.n, f.kind, f.node.Name, strings.Join(which, ", ")))
		}
	}
}

// finish fills in the simulator's totals and the whole-run frame check.
func (c *cluster) finish(rep *Report) {
	tot := c.sim.Totals()
	rep.MaxLive = tot.MaxLiveSessions
	rep.Identifies, rep.Resumes = tot.Identifies, tot.Resumes
	rep.RefusedIdentifies, rep.FailedResumes = tot.RefusedIdentifies, tot.FailedResumes
	for _, fr := range c.frames.all() {
		rep.Frames++
		if fr.node == "" {
			rep.UnknownFrames++
			continue
		}
		if !c.owned(fr) {
			rep.ForeignFrames = append(rep.ForeignFrames, fr.String())
		}
	}
	for _, n := range c.nodes {
		if strings.Contains(n.Log(), token) {
			rep.Violations = append(rep.Violations, n.Name+"'s log holds the bot token")
		}
	}
}

// Report is what a soak measured.
type Report struct {
	Config   Config
	Faults   map[Kind]int
	Failover map[Kind][]time.Duration // fault → every shard READY on exactly one node
	Recovery map[Kind][]time.Duration // repair → balanced again
	Sessions map[Kind]Sessions        // sessions started during the faults of a kind and their repairs
	Settle   []time.Duration          // waits for the identify slots to expire before an etcd kill
	Duration time.Duration

	MaxLive                          int64 // most live sessions of one shard at the gateway, ever
	Identifies, Resumes              int64
	RefusedIdentifies, FailedResumes int64

	Frames        int // client frames the gateway received
	UnknownFrames int // whose sender the soak could not find
	WakeFrames    int // sent by nodes after SIGCONT
	// QuietAtWake counts the sessions attached to an open but silent
	// connection when a paused node was woken: the paused node's
	// connections, still open at the gateway as at Discord (see the
	// package doc).
	QuietAtWake int64
	// OverBound counts the failovers and recoveries that took longer
	// than Config.Bound but converged within Config.HangBound.
	OverBound     int
	ForeignFrames []string // sent by a node for a shard it did not own
	// Wakes is what each node woken from SIGSTOP delivered after its
	// deadline; Placements the placement after every join and leave.
	Wakes      []Wake
	Placements []Balance
	Violations []string
}

// Sessions counts the gateway's answered identifies (new sessions) and
// resumes.
type Sessions struct{ Identifies, Resumes int64 }

// Err is nil when the report shows no broken invariant.
func (r *Report) Err() error {
	var errs []error
	for _, v := range r.Violations {
		errs = append(errs, errors.New(v))
	}
	for _, f := range r.ForeignFrames {
		errs = append(errs, fmt.Errorf("a frame for a shard its sender did not own: %s", f))
	}
	if r.MaxLive > 1 {
		errs = append(errs, fmt.Errorf("max live sessions of one shard %d; want 1", r.MaxLive))
	}
	return errors.Join(errs...)
}

// proxySet is a node's way to etcd: a Proxy per member.
type proxySet []*Proxy

// urls is the node's --etcd.
func (ps proxySet) urls() string {
	var out []string
	for _, p := range ps {
		out = append(out, "http://"+p.Addr())
	}
	return strings.Join(out, ",")
}

// Cut cuts the node off from every member.
func (ps proxySet) Cut() {
	for _, p := range ps {
		p.Cut()
	}
}

// Heal ends the cut.
func (ps proxySet) Heal() error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Heal())
	}
	return errors.Join(errs...)
}

// Close closes every proxy.
func (ps proxySet) Close() {
	for _, p := range ps {
		p.Close()
	}
}

// memberFault runs a fault of one etcd member (MemberKill, LeaderKill,
// MemberPartition, LeaderPartition) for 2 × TTL, checks that every shard is still READY on
// exactly one node at its end (nothing lost while etcd kept a quorum),
// and repairs it; it returns when the repair began.
//
// A fault after which the cluster did not converge within the hang bound
// is a violation, but the soak repairs it all the same and goes on if the
// cluster then recovers: what one stuck fault costs is seen, and the run
// still measures the faults after it.
func (c *cluster) memberFault(ctx context.Context, rep *Report, f fault, logf func(string, ...any)) (time.Time, error) {
	if len(c.etcd.Members) < 3 {
		return time.Time{}, fmt.Errorf("%s needs 3 etcd members; the soak has %d", f.kind, len(c.etcd.Members))
	}
	leader, err := c.etcd.Leader(ctx, c.cli)
	if err != nil {
		return time.Time{}, err
	}
	var m *Etcd
	partition := f.kind == MemberPartition || f.kind == LeaderPartition
	switch f.kind {
	case LeaderKill, LeaderPartition:
		m = leader
	default:
		var others []*Etcd
		for _, e := range c.etcd.Members {
			if e != leader {
				others = append(others, e)
			}
		}
		m = others[f.rng.IntN(len(others))]
	}
	began := time.Now()
	if partition {
		c.etcd.Partition(m)
	} else {
		m.Kill()
	}
	if m == leader {
		if next, err := c.awaitLeader(ctx, m); err != nil {
			logf("no new leader: %v", err)
		} else {
			logf("leader %s gone; %s leads after %v", m.name, next.name, time.Since(began).Round(time.Millisecond))
		}
	}
	time.Sleep(2*c.cfg.TTL - time.Since(began))
	// Held for 2 × TTL, so that a node whose renewals the fault held back
	// would have fenced itself: every shard must still run, once.
	if _, err := c.converge(ctx, nil, nil, c.cfg.hangBound()); err != nil {
		if ctx.Err() != nil {
			return time.Time{}, err
		}
		rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d (%s, member %s, leader %v): %v after etcd kept a quorum for 2 × TTL", f.n, f.kind, m.name, m == leader, err))
		logf("NOT CONVERGED, etcd member %s (leader %v): %v; repairing it and going on", m.name, m == leader, err)
	}
	repaired := time.Now()
	if partition {
		err = c.etcd.Heal(m)
	} else {
		err = m.Start(ctx)
	}
	logf("etcd member %s (leader %v) %s for %v", m.name, m == leader, map[Kind]string{MemberKill: "killed", LeaderKill: "killed", MemberPartition: "partitioned", LeaderPartition: "partitioned"}[f.kind], repaired.Sub(began).Round(time.Millisecond))
	return repaired, err
}

// awaitLeader waits, at most ReadyTimeout, for a leader other than old.
func (c *cluster) awaitLeader(ctx context.Context, old *Etcd) (*Etcd, error) {
	deadline := time.Now().Add(ReadyTimeout)
	for {
		if l, err := c.etcd.Leader(ctx, c.cli); err == nil && l != old {
			return l, nil
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("none but %s within %v: %v", old.name, ReadyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
