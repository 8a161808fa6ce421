package node

import (
	"context"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/lease/local"
	"github.com/shardfs/shardfs/relay"
	"github.com/shardfs/shardfs/reshard"
	"github.com/shardfs/shardfs/shardfs"
)

// planRun is one plan's running parts. A node runs one, and two during a
// move to a larger plan (package reshard runs the move).
type planRun struct {
	transport *gateway.Transport
	core      *core.Scheduler
	tree      *shardfs.Tree
	lease     *local.OperatorLease
	route     *reshard.Route // the transport's sink
}

var _ reshard.PlanRun = (*planRun)(nil)

func (p *planRun) Plan() core.Plan                      { return p.core.Plan() }
func (p *planRun) Start()                               { p.core.Start() }
func (p *planRun) Snapshot(dst []core.Diag) []core.Diag { return p.core.Snapshot(dst) }
func (p *planRun) Route() *reshard.Route                { return p.route }

func (p *planRun) End() error {
	p.core.End()
	return p.transport.Close()
}

// newMover returns the node's mover; call it once the fleet, if any, is
// set up.
func (s *Node) newMover() *reshard.Mover {
	return reshard.NewMover(reshard.MoverConfig{
		Flavor: s.cfg.Flavor, Auto: s.cfg.Reshard, Fleet: s.Fleet != nil,
		Current: func() reshard.PlanRun { return s.current() },
		Build: func(total int, prev reshard.PlanRun) (reshard.PlanRun, error) {
			p, err := s.buildPlan(core.Range(total, 0, total-1), prev.(*planRun))
			if err != nil {
				return nil, err
			}
			return p, nil
		},
		Show: func(p reshard.PlanRun) {
			s.planMu.Lock()
			s.cur = p.(*planRun)
			s.planMu.Unlock()
			s.replanRelay(p.(*planRun))
		},
		Recommend:      s.recommend,
		Budget:         s.Pacer.Budget,
		MaxConcurrency: s.Pacer.MaxConcurrency,
		Events:         s.events,
		Logger:         s.log,
		Clock:          s.clock,
	})
}

// recommend is what the bot needs now: Discord's discovery (shards and
// max_concurrency), Fluxer's community count.
func (s *Node) recommend(ctx context.Context) (answer, maxConcurrency int, err error) {
	if s.cfg.Flavor == core.Fluxer {
		n, err := gateway.CountGuilds(ctx, nil, s.cfg.Flavor, s.cfg.API, s.cfg.Token)
		return n, 0, err
	}
	d, err := gateway.Discover(ctx, nil, s.cfg.Flavor, s.cfg.API, s.cfg.Token)
	return d.Shards, d.StartLimit.MaxConcurrency, err
}

// RefuseMoves makes the node refuse every move to a larger plan, by hand
// or on a 4011, with reason (what the operator should do instead): for a
// node whose plan something else decides, as a child of supervise. Call
// it before Start.
func (s *Node) RefuseMoves(reason string) { s.move.Refuse(reason) }

// current returns the plan the tree shows.
func (s *Node) current() *planRun {
	s.planMu.RLock()
	defer s.planMu.RUnlock()
	return s.cur
}

// Current returns the core and the tree of the plan the node runs now:
// the fields Scheduler and Tree are the plan it started with.
func (s *Node) Current() (*core.Scheduler, *shardfs.Tree) {
	p := s.current()
	return p.core, p.tree
}

// buildPlan assembles a plan's transport, core and tree. prev is the plan
// it replaces (nil for the first): the new one carries on its dispatch
// log and shares its transport's spacing of identifies.
func (s *Node) buildPlan(plan core.Plan, prev *planRun) (*planRun, error) {
	cfg := s.cfg
	p := &planRun{lease: local.New(s.clock)}
	p.route = reshard.NewRoute(func(shard int, session string, seq int64, name string, d []byte) {
		p.tree.Dispatch(shard, session, seq, name, d)
	})
	// The fleet's lease, session store and identify pacer replace the
	// node's own (a fleet never moves to a new plan, so only a first plan
	// has a fleet).
	var lease core.Lease = p.lease
	var pacer core.IdentifyPacer = s.Pacer
	onStartLimit, budget := s.Pacer.SetStartLimit, s.Pacer.Budget
	if cfg.IdentifyPacer != nil {
		pacer = cfg.IdentifyPacer
	}
	fleet := s.Fleet
	if prev != nil {
		fleet = nil
	}
	var confirm core.Confirmer
	if fleet != nil && fleet.Confirm != nil {
		confirm = fleet.Confirm
	}
	var onTokenRefused func(shard, code int, err error)
	written := cfg.IdentifyWritten
	if fleet != nil {
		lease, onTokenRefused = fleet, fleet.tokenRefused
		if fleet.Identify != nil {
			pacer, onStartLimit, budget = fleet.Identify, fleet.Identify.SetStartLimit, fleet.Identify.Budget
			// The fleet's pacer frees a bucket 5 s after its identify
			// was written rather than when the key's lease runs out.
			written = fleet.Identify.Written
			if w := cfg.IdentifyWritten; w != nil {
				written = func(shard int, at time.Time) { w(shard, at); fleet.Identify.Written(shard, at) }
			}
		}
	}
	gc := gateway.Config{
		Flavor: cfg.Flavor, Token: cfg.Token, Intents: cfg.Intents,
		API: cfg.API, GatewayURL: cfg.GatewayURL, Compression: cfg.Compression,
		Sink:              p.route.Dispatch,
		OnStartLimit:      onStartLimit,
		OnSession:         cfg.OnSession,
		IdentifyNotBefore: cfg.IdentifyNotBefore, IdentifyWritten: written,
		Clock: cfg.Clock, Logger: s.log.With("component", "gateway", "total", plan.Total),
	}
	var dispatch *journal.Merged
	if prev != nil {
		gc.ShareIdentifyGate, dispatch = prev.transport, prev.tree.NodeDispatchLog()
	}
	tr, err := gateway.New(gc)
	if err != nil {
		return nil, err
	}
	p.transport = tr
	var tree *shardfs.Tree // set below; ObserveEvent runs only after Start
	observe := func(kind string, d time.Duration) {
		tree.ObserveEvent(kind, d)
		if cfg.ObserveEvent != nil {
			cfg.ObserveEvent(kind, d)
		}
	}
	c, err := core.New(core.Config{
		Plan: plan, Flavor: cfg.Flavor, Transport: tr, Pacer: pacer, Lease: lease, Confirm: confirm,
		Backoff: cfg.Backoff, Clock: cfg.Clock, Logger: s.log.With("component", "core", "total", plan.Total),
		ObserveEvent: observe,
		Sessions:     cfg.Sessions, ResumeWindow: cfg.ResumeWindow, Gateway: orString(cfg.Gateway, cfg.GatewayURL),
		OnFatal: s.move.OnFatal(p), Events: s.events, EventRetention: cfg.EventRetention,
		OnTokenRefused: onTokenRefused,
	})
	if err != nil {
		tr.Close()
		return nil, err
	}
	p.core = c
	reg := cfg.Registry
	if dispatch != nil {
		reg = nil // the first plan's tree registered its collector there
	}
	tc := shardfs.Config{
		Scheduler: c, Info: s.info, Identify: budget, LeaseBackend: "local",
		DispatchRetention: cfg.DispatchRetention, NodeDispatchRetention: cfg.NodeDispatchRetention,
		Registry: reg, Logger: s.log, Dispatch: dispatch,
		Files:   append([]fsrv.File{&fsrv.Text{Name: "reshard", Content: s.move.File}}, cfg.Files...),
		Command: s.move.Command, CommandUsage: reshard.Usage,
	}
	if fleet != nil {
		fleet.treeConfig(&tc)
		// reshard first (it refuses in a fleet, saying why), then drain.
		drain, usage := tc.Command, tc.CommandUsage
		tc.Command = func(line string) (bool, error) {
			if handled, err := s.move.Command(line); handled {
				return handled, err
			}
			return drain(line)
		}
		tc.CommandUsage = reshard.Usage + usage
	}
	if cfg.Relay {
		s.relayTree(&tc)
	}
	tree = shardfs.New(tc)
	if cfg.Relay && prev != nil {
		// The new plan's tree has a registry of its own (/metrics shows
		// the current plan's).
		tree.Registry().MustRegister(s.Relay.Collector())
	}
	if fleet != nil {
		fleet.register(tree.Registry())
	}
	p.tree = tree
	return p, nil
}

// replanRelay makes the relay serve p, the plan the node has switched
// to: its clients identify with p's total from now on (package relay,
// Server.Replan).
func (s *Node) replanRelay(p *planRun) {
	if s.Relay == nil {
		return
	}
	if err := s.Relay.Replan(p.Plan().Total, p.Plan().Local, p.tree.DispatchLog, p.core.Send); err != nil {
		s.log.Warn("relay: the new plan is not served", "err", err)
	}
}

// relayTree adds /relay, /clients and kick to a tree's configuration
// (every plan's: the tree shows the current one); they read Node.Relay,
// made after the first plan.
func (s *Node) relayTree(tc *shardfs.Config) {
	tc.Files = append(tc.Files,
		&fsrv.Text{Name: "relay", Content: func() []byte { return s.Relay.Status() }},
		&fsrv.Text{Name: "clients", Content: func() []byte { return s.Relay.ClientsText() }})
	next, usage := tc.Command, tc.CommandUsage
	tc.Command = func(line string) (bool, error) {
		if handled, err := s.Relay.Command(line); handled {
			return handled, err
		}
		return next(line)
	}
	tc.CommandUsage = usage + relay.Usage
}
