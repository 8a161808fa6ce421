package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	leaseetcd "github.com/shardfs/shardfs/lease/etcd"
	"github.com/shardfs/shardfs/lease/etcd/identify"
	sessetcd "github.com/shardfs/shardfs/sessions/etcd"
	"github.com/shardfs/shardfs/shardfs"
)

// Etcd makes a node one of several sharing a bot through etcd (DESIGN
// 7.3): the plan's shards are the node's candidates, the ones it owns run,
// the session store is etcd's and Discord identifies are paced across the
// nodes.
//
// Decisions where DESIGN is silent:
//   - The operator's lease ("lease DURATION" on /ctl) is the node's, not a
//     shard's: while it is armed the node renews its etcd lease only
//     before its deadline, so a health script that stops renewing hands
//     the node's shards to the others within the etcd TTL, and the node
//     stays out (/lease: state held, operator_lease expired) until the
//     operator's lease is renewed. "lease off" disarms it. A shard's own
//     "lease" command is refused under etcd.
//   - "drain" on /ctl returns at once; /lease shows state draining, then
//     left. A drained node serves its tree and owns nothing until it is
//     restarted.
//   - Shutdown (SIGTERM, Close) drains first, bounded by DrainTimeout;
//     what is left when it runs out is released by revoking the lease, and
//     those shards start new sessions elsewhere. A drain's moves are not
//     paced, whether another member takes the shards or nobody does
//     (snapshots saved, for the node's own restart to resume): whoever
//     starts a shard next resumes it, which spends no identify, so a node
//     stops within seconds whatever its shard count (issue 22 item 9,
//     attack finding F4). A join's moves stay paced (max_concurrency per
//     5 s, the figure discovery gave, not only the flag's).
//   - Fluxer has no identify buckets and its budget is per source address
//     (DESIGN section 2), so it is not paced through etcd: each node paces
//     its own, which is right for nodes on separate machines. Nodes that
//     share an address split it: Etcd.FluxerIdentifyBudget
//     (--fluxer-identify-budget) identifies per minute, 300 / N for N such
//     nodes. Without it each node paces the whole 300 and a line says that
//     nodes sharing an address may exceed it.
type Etcd struct {
	// Endpoints are etcd's client URLs (--etcd).
	Endpoints []string
	// TLS, when set, is the client's TLS configuration (--etcd-ca,
	// --etcd-cert, --etcd-key).
	TLS *tls.Config
	// Username and Password authenticate to etcd (--etcd-user, and
	// --etcd-password-file or SHARDFS_ETCD_PASSWORD); empty: no auth.
	Username, Password string
	// Client, when set, is used instead of dialling Endpoints (tests); the
	// node does not close it.
	Client *clientv3.Client
	Bot    string
	// Node is this node's name (--node); empty means the host name.
	Node string
	// TTL is the node's etcd lease (--etcd-ttl); zero means 10 s.
	TTL time.Duration
	// DrainTimeout bounds the drain at Close; zero means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// IdentifyKeyTTL is the identify bucket keys' lease (identify.Config.
	// KeyTTL); zero means its default. Tests shorten it along with the
	// simulator's identify interval.
	IdentifyKeyTTL time.Duration
	// FluxerIdentifyBudget is this node's share of Fluxer's identifies per
	// window (--fluxer-identify-budget); zero means Fluxer's whole budget.
	FluxerIdentifyBudget int
	// Unconfirmed turns confirmed delivery off (--confirm-delivery=false):
	// received events are delivered without waiting for etcd to confirm
	// the node's lease (core.Confirmer), saving a round trip per event,
	// at the price that a node frozen by its hypervisor past its TTL
	// delivers what it reads after the thaw (doc/fleet.md).
	Unconfirmed bool
}

// DefaultDrainTimeout bounds the drain at shutdown. The moves run all at
// once, each bounded: the close handshake 5 s before the connection is
// fenced and closed, the snapshot's save 5 s, the key's release 5 s; the
// rest is room for a loaded machine. With the 17 s of a clean stop after
// it, a stop fits systemd's TimeoutStopSec of 60 s in the example unit.
const DefaultDrainTimeout = 30 * time.Second

// fluxerPacing is the Fluxer identify budget of a node of cfg: the
// fleet's share when one is given.
func fluxerPacing(cfg Config) core.FluxerPacing {
	p := cfg.FluxerPacing
	if p.Budget < 1 {
		p = core.DefaultFluxerPacing
	}
	if cfg.Etcd != nil && cfg.Etcd.FluxerIdentifyBudget > 0 {
		p.Budget = min(p.Budget, cfg.Etcd.FluxerIdentifyBudget)
	}
	return p
}

// Fleet is a node's part in a fleet: the ownership loop and what the tree
// shows of it.
type Fleet struct {
	Ownership *leaseetcd.Ownership
	Identify  *identify.Pacer // nil for Fluxer
	Store     *sessetcd.Store
	// Confirm holds each received event until etcd confirms the node's
	// lease (Ownership.Confirm, one read shared by every shard); nil with
	// Etcd.Unconfirmed.
	Confirm *core.Confirmations

	client    *clientv3.Client
	ownClient bool
	clock     clock.Clock
	log       *slog.Logger
	drainMax  time.Duration
	flagMC    int // --max-concurrency, at least 1

	mu         sync.Mutex
	node       *core.Scheduler
	opDeadline time.Duration // monotonic; 0: the operator's lease is off
	opGen      uint64
	cancel     context.CancelFunc
	done       chan struct{}
	runErr     error
	refused    chan error
	drainOnce  sync.Once
	drained    chan struct{} // closed when the drain ended, drainErr set
	drainErr   error
}

func newFleet(cfg Config, log *slog.Logger, clk clock.Clock) (*Fleet, error) {
	e := cfg.Etcd
	if e.Bot == "" {
		return nil, errors.New("--etcd needs --bot")
	}
	f := &Fleet{client: e.Client, clock: clk, log: log.With("component", "etcd"), refused: make(chan error, 1), drained: make(chan struct{})}
	if f.client == nil {
		if len(e.Endpoints) == 0 {
			return nil, errors.New("--etcd: no endpoint")
		}
		c, err := clientv3.New(clientv3.Config{
			Endpoints: e.Endpoints, TLS: e.TLS, DialTimeout: 5 * time.Second,
			Username: e.Username, Password: e.Password,
			Logger: zap.NewNop(),
		})
		if err != nil {
			return nil, fmt.Errorf("--etcd: %w", err)
		}
		f.client, f.ownClient = c, true
	}
	ttl := e.TTL
	if ttl == 0 {
		ttl = leaseetcd.DefaultTTL
	}
	mc := max(cfg.MaxConcurrency, 1)
	f.flagMC = mc
	f.drainMax = e.DrainTimeout
	if f.drainMax == 0 {
		f.drainMax = DefaultDrainTimeout
	}
	plan := leaseetcd.Plan{Flavor: cfg.Flavor.String(), Total: cfg.Plan.Total}
	return f, f.init(cfg, plan, ttl, mc)
}

func (f *Fleet) init(cfg Config, plan leaseetcd.Plan, ttl time.Duration, mc int) error {
	e := cfg.Etcd
	node := e.Node
	o, err := leaseetcd.NewOwnership(leaseetcd.OwnershipConfig{
		Client: f.client, Bot: e.Bot, Node: node, Plan: plan, Candidates: cfg.Plan.Local,
		TTL: ttl, MaxConcurrency: mc, MaxConcurrencyNow: f.maxConcurrency, Shards: lateShards{f}, MayRenew: f.mayRenew,
		Clock: cfg.Clock, Logger: f.log,
	})
	if err != nil {
		f.close()
		return err
	}
	f.Ownership = o
	if !e.Unconfirmed {
		f.Confirm = core.NewConfirmations(o.Confirm, cfg.Clock, 0)
	}
	f.Store, err = sessetcd.New(sessetcd.Config{KV: leaseetcd.RequireLeader(f.client), Guard: o, Generation: o.Generation})
	if err != nil {
		f.close()
		return err
	}
	if cfg.Flavor != core.Discord && e.FluxerIdentifyBudget == 0 {
		f.log.Warn("Fluxer's identify budget is per source address and paced per node: N nodes sharing one address may together exceed it; give each of them --fluxer-identify-budget 300/N", "budget_per_node", fluxerPacing(cfg).Budget)
	}
	if cfg.Flavor == core.Discord && e.FluxerIdentifyBudget != 0 {
		f.close()
		return errors.New("--fluxer-identify-budget is for --flavor fluxer: Discord's identifies are paced across the nodes through etcd")
	}
	if cfg.Flavor == core.Discord {
		f.Identify, err = identify.New(identify.Config{
			Client: f.client, Prefix: o.Prefix(), Node: node, MaxConcurrency: mc,
			Total: cfg.IdentifyTotal, Ceiling: cfg.IdentifyTotal, KeyTTL: e.IdentifyKeyTTL, Clock: cfg.Clock, Logger: f.log,
		})
		if err != nil {
			f.close()
			return err
		}
		f.Identify.SetReserve(cfg.IdentifyReserve)
	}
	return nil
}

// maxConcurrency is the max_concurrency in force for the pacing of
// planned moves: Discord's, as the identify pacer last learnt it from
// discovery (the flag's value is only the figure until then).
func (f *Fleet) maxConcurrency() int {
	if f.Identify != nil {
		return f.Identify.Budget().MaxConcurrency
	}
	return f.flagMC
}

// lateShards reaches the core once New has made it: the ownership loop
// runs only after Start.
type lateShards struct{ f *Fleet }

func (l lateShards) SetLease(g core.LeaseGrant) { l.f.core().SetLease(g) }
func (l lateShards) Handover(id int) (bool, error) {
	return l.f.core().Handover(id)
}

func (f *Fleet) core() *core.Scheduler {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.node
}

// Arm implements core.Lease for the operator's lease under etcd: it arms
// the node's lease (see Etcd) and grants no shard anything: ownership
// grants come from etcd alone.
func (f *Fleet) Arm(shards []int, d time.Duration) ([]core.LeaseGrant, error) {
	if err := f.nodeWide(shards); err != nil {
		return nil, err
	}
	f.mu.Lock()
	now := clock.Mono(f.clock)
	if f.opDeadline == 0 || now >= f.opDeadline {
		f.opGen++
	}
	f.opDeadline = now + d
	f.mu.Unlock()
	f.log.Info("operator lease armed: etcd renewals continue only until it runs out", "duration", d)
	return nil, nil
}

// Off implements core.Lease: it disarms the operator's lease.
func (f *Fleet) Off(shards []int) ([]core.LeaseGrant, error) {
	if err := f.nodeWide(shards); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.opDeadline = 0
	f.mu.Unlock()
	return nil, nil
}

func (f *Fleet) nodeWide(shards []int) error {
	f.mu.Lock()
	n := f.node
	f.mu.Unlock()
	if n != nil && len(shards) != len(n.Plan().Local) {
		return fmt.Errorf("%w: under --etcd the operator's lease is the node's: write it to /ctl", core.ErrUsage)
	}
	return nil
}

func (f *Fleet) mayRenew() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opDeadline == 0 || clock.Mono(f.clock) < f.opDeadline
}

// operatorLease is the operator's lease lines of /lease.
func (f *Fleet) operatorLease() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opDeadline == 0 {
		return "operator_lease off\n"
	}
	left := f.opDeadline - clock.Mono(f.clock)
	if left <= 0 {
		return "operator_lease expired\n"
	}
	return fmt.Sprintf("operator_lease armed\noperator_remaining %s\n", left.Round(time.Millisecond))
}

func (f *Fleet) leaseText() []byte {
	return append(f.Ownership.LeaseText(f.clock.Now()), f.operatorLease()...)
}

// treeConfig adds the fleet's files and commands to the tree.
func (f *Fleet) treeConfig(c *shardfs.Config) {
	c.LeaseBackend = "etcd"
	c.Lease = f.leaseText
	c.Files = append(c.Files,
		&fsrv.Text{Name: "members", Content: f.Ownership.MembersText},
		&fsrv.Text{Name: "owners", Content: f.Ownership.OwnersText},
	)
	c.Command, c.CommandUsage = f.command, "drain\n"
}

// command handles drain on /ctl: it starts the drain and returns at once;
// /lease shows state draining, then left. A refused drain is logged to
// the node's events like the core's refusals.
func (f *Fleet) command(line string) (bool, error) {
	words := strings.Fields(line)
	if len(words) == 0 || words[0] != "drain" {
		return false, nil
	}
	if len(words) > 1 {
		return true, fmt.Errorf("%w: drain takes no argument, got %q", core.ErrUsage, strings.Join(words[1:], " "))
	}
	f.startDrain(context.Background(), nil)
	return true, nil
}

// register adds the fleet's metrics.
func (f *Fleet) register(reg *prometheus.Registry) {
	st := func(get func(leaseetcd.Status) float64) func() float64 {
		return func() float64 { return get(f.Ownership.Status()) }
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardfs_owned_shards", Help: "Shards this node owns through etcd."},
			st(func(s leaseetcd.Status) float64 { return float64(s.Owned) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shardfs_shard_moves_total", Help: "Planned moves of shards away from this node."},
			st(func(s leaseetcd.Status) float64 { return float64(s.Moves) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shardfs_fencing_stops_total", Help: "Shards stopped because this node's etcd lease or key was lost."},
			st(func(s leaseetcd.Status) float64 { return float64(s.FencingStops) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardfs_etcd_renew_latency_seconds", Help: "Round trip of the last etcd lease renewal."},
			st(func(s leaseetcd.Status) float64 { return s.RenewLatency.Seconds() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardfs_etcd_lease_remaining_seconds", Help: "Time left before this node's fencing deadline."},
			st(func(s leaseetcd.Status) float64 { return s.Remaining.Seconds() })),
	)
}

// start marks every candidate not owned and starts the ownership loop.
func (f *Fleet) start(n *core.Scheduler) {
	f.mu.Lock()
	f.node = n
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan struct{})
	f.mu.Unlock()
	go func() {
		defer close(f.done)
		err := f.Ownership.Run(ctx)
		if err != nil {
			f.refused <- err
		}
	}()
}

// Refused delivers the error that keeps the node out of the bot (a plan
// mismatch naming both plans): serve exits with it.
func (f *Fleet) Refused() <-chan error { return f.refused }

// startDrain starts the drain once, for why (nil: the operator's drain or
// a shutdown); the channel is closed when it ended, and drainErr says how.
func (f *Fleet) startDrain(ctx context.Context, why error) <-chan struct{} {
	f.drainOnce.Do(func() {
		go func() {
			dctx, cancel := context.WithTimeout(ctx, f.drainMax)
			defer cancel()
			f.drainErr = f.Ownership.Withdraw(dctx, why)
			close(f.drained)
		}()
	})
	return f.drained
}

// ErrTokenRefused is the /lease error of a node that left the fleet
// because the gateway refused the bot's token.
var ErrTokenRefused = errors.New("the bot's token was refused: this node handed its shards back and stays out of the fleet; restart it with a working token")

// tokenRefused is core.Config.OnTokenRefused in a fleet. A refused token
// is the bot's, not a shard's (issue 22 item 11): every shard of the node
// went FATAL at once. Kept, the keys would hold those shards FATAL here,
// and no node with a working token could take them (attack finding F2: a
// token revoked while the fleet runs). So the node drains, as on /ctl:
// each key is released (a FATAL shard saves no snapshot), the node leaves
// and does not join again, and no identify is spent here. Another node
// that takes a shard with the same refused token is refused too, at its
// first connection, and does likewise; a node (re)started with a working
// token (serve checks it before joining) takes them all.
func (f *Fleet) tokenRefused(shard, code int, err error) {
	why := fmt.Errorf("%w (shard %d, code %d: %v)", ErrTokenRefused, shard, code, err)
	f.log.Error("the gateway refused the bot's token: handing every shard back to the fleet and leaving it", "shard", shard, "code", code, "err", err)
	f.startDrain(context.Background(), why)
}

// Drain hands every owned shard over and leaves the bot (see
// etcd.Ownership.Drain), bounded by ctx and Etcd.DrainTimeout.
func (f *Fleet) Drain(ctx context.Context) error {
	select {
	case <-f.startDrain(ctx, nil):
		return f.drainErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown drains (bounded), stops the loop and closes what the fleet
// opened.
func (f *Fleet) shutdown() {
	f.mu.Lock()
	cancel, done := f.cancel, f.done
	f.mu.Unlock()
	if cancel != nil {
		<-f.startDrain(context.Background(), nil)
		if f.drainErr != nil {
			f.log.Warn("drain at shutdown did not finish; the rest of the shards start new sessions elsewhere", "err", f.drainErr)
		}
		cancel()
		<-done
	}
	f.close()
}

func (f *Fleet) close() {
	if f.Confirm != nil {
		f.Confirm.Close()
	}
	if f.Identify != nil {
		f.Identify.Close()
	}
	if f.ownClient && f.client != nil {
		f.client.Close()
	}
}
