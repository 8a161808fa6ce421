// Package demo runs the gateway simulator and a shardfs node against it in
// one process, with traffic flowing and, optionally, faults injected at
// random: the `shardfs demo` command, and the stack the integration tests
// mount.
package demo

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/node"
)

// Config configures a demo. The zero value runs four Discord shards.
type Config struct {
	Flavor core.Flavor
	// Shards is how many shards the bot has; the node runs all of them
	// (default 4).
	Shards int
	// Traffic is MESSAGE_CREATE events per second per shard (default 1;
	// negative means none).
	Traffic     float64
	Compression gateway.Compression
	// Chaos injects a random recoverable fault into a random shard this
	// often; zero means never.
	Chaos time.Duration
	// Backoff is the node's reconnect policy; nil means the default.
	Backoff core.BackoffPolicy
	// HeartbeatInterval is the simulator's (default 41.25 s).
	HeartbeatInterval time.Duration
	Clock             clock.Clock
	Logger            *slog.Logger
}

// MinChaos is the shortest chaos interval: faster, shards would spend their
// time reconnecting and nothing else would show.
const MinChaos = 100 * time.Millisecond

// Demo is a running simulator and the node connected to it. The embedded
// Node gives the node's parts: Node, Tree, Server, Transport.
type Demo struct {
	Sim *gatewaysim.Server
	*node.Node

	clock  clock.Clock
	log    *slog.Logger
	chaos  time.Duration
	rng    *rand.Rand
	cancel context.CancelFunc
	mu     sync.Mutex // the chaos timer is armed before it is stored
	timer  clock.Timer
}

// Start starts the simulator and the node, and begins connecting the
// shards. The context bounds the chaos, not the node: call Close.
func Start(ctx context.Context, cfg Config) (*Demo, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = 4
	}
	if cfg.Traffic == 0 {
		cfg.Traffic = 1
	}
	if cfg.Chaos < 0 || cfg.Chaos > 0 && cfg.Chaos < MinChaos {
		return nil, fmt.Errorf("demo: chaos every %v: want 0 or at least %v", cfg.Chaos, MinChaos)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	token := crand.Text() // the simulator's token: random, never shown
	simFlavor := gatewaysim.Discord
	if cfg.Flavor == core.Fluxer {
		simFlavor = gatewaysim.Fluxer
	}
	sim, err := gatewaysim.New(gatewaysim.Config{
		Flavor: simFlavor, Token: token, Shards: cfg.Shards, Guilds: 2 * cfg.Shards,
		MaxConcurrency:    min(cfg.Shards, 16),
		HeartbeatInterval: cfg.HeartbeatInterval,
		Traffic:           gatewaysim.Traffic{PerShard: max(cfg.Traffic, 0)},
		Clock:             cfg.Clock,
		Logger:            log.With("component", "simulator"),
	})
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	sup, err := node.New(node.Config{
		Flavor: cfg.Flavor, Token: token, API: sim.APIURL(),
		Plan:        core.Range(cfg.Shards, 0, cfg.Shards-1),
		Compression: cfg.Compression, Backoff: cfg.Backoff,
		Intents: gatewaysim.IntentGuilds | gatewaysim.IntentGuildMessages,
		Clock:   cfg.Clock, Logger: log, IdentifyReserve: gateway.DefaultReserve,
	})
	if err != nil {
		sim.Close()
		return nil, err
	}
	d := &Demo{Sim: sim, Node: sup, clock: clock.Or(cfg.Clock), log: log, chaos: cfg.Chaos}
	d.rng = rand.New(rand.NewPCG(uint64(d.clock.Now().UnixNano()), 7))
	sup.Start()
	if cfg.Chaos > 0 {
		ctx, d.cancel = context.WithCancel(ctx)
		d.mu.Lock()
		d.timer = d.clock.AfterFunc(cfg.Chaos, func() { d.injectChaos(ctx) })
		d.mu.Unlock()
	}
	return d, nil
}

// chaosFaults are faults a shard recovers from by itself.
var chaosFaults = []gatewaysim.Fault{
	{Kind: gatewaysim.FaultDrop},
	{Kind: gatewaysim.FaultClose, Code: 4000},
	{Kind: gatewaysim.FaultClose, Code: 4009},
	{Kind: gatewaysim.FaultCloseNoStatus},
	{Kind: gatewaysim.FaultReconnect},
	{Kind: gatewaysim.FaultInvalidSession, Resumable: true},
	{Kind: gatewaysim.FaultInvalidSession},
	{Kind: gatewaysim.FaultGarbage},
}

func (d *Demo) injectChaos(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	f := chaosFaults[d.rng.IntN(len(chaosFaults))]
	ids := d.Node.Scheduler.Plan().Local
	shard := ids[d.rng.IntN(len(ids))]
	d.Sim.Inject(shard, f)
	d.log.Info("chaos", "shard", shard, "fault", f.String())
	d.mu.Lock()
	d.timer.Reset(d.chaos)
	d.mu.Unlock()
}

// Wait returns once cond holds, looking again at every line of the node's
// events log and at every dispatch, or ctx's error once ctx ends.
func (d *Demo) Wait(ctx context.Context, cond func() bool) error {
	for {
		// Take the channels before looking, so that no change slips
		// between the look and the wait.
		events, dispatch := d.Node.Scheduler.Events().Notify(), d.Tree.NodeDispatchLog().Notify()
		if cond() {
			return nil
		}
		select {
		case <-events:
		case <-dispatch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops the chaos, the node and the simulator.
func (d *Demo) Close() error {
	if d.cancel != nil {
		d.cancel()
		d.mu.Lock()
		d.timer.Stop()
		d.mu.Unlock()
	}
	return errors.Join(d.Node.Close(), d.Sim.Close())
}
