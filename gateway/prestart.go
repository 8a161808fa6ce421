package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// DefaultReserve asks for the default reserve of session starts: 1% of
// the total, at least 1 (core.Pacer.SetReserve's encoding, which
// --identify-reserve and node.Config take as is: negative is the
// default, 0 none, N that many).
const DefaultReserve = -1

// Pacing is how a node, or a supervisor for its children, paces identifies
// before discovery says more: serve's identify flags.
type Pacing struct {
	Flavor core.Flavor
	// MaxConcurrency is Discord's max_concurrency until discovery says
	// otherwise (default 1).
	MaxConcurrency int
	// IdentifyTotal is Discord's session start total per 24 h when no
	// discovery will say (Fixed; default core.DiscordStartTotal), and caps
	// what discovery says otherwise (0: no cap).
	IdentifyTotal int
	// IdentifyReserve is how many of those starts automatic new sessions
	// leave to the operator's identify and retry: DefaultReserve
	// (negative), 0 for none, or that many.
	IdentifyReserve int
	// Fixed says the gateway URL was given: no discovery will say the
	// session start limit.
	Fixed bool
	// Fluxer is Fluxer's identify budget (default
	// core.DefaultFluxerPacing).
	Fluxer core.FluxerPacing
}

// NewPacer is the identify pacer p describes, on clk (nil: the real
// clock).
func NewPacer(clk clock.Clock, p Pacing) *core.Pacer {
	if p.Flavor == core.Fluxer {
		if p.Fluxer.Budget < 1 {
			p.Fluxer = core.DefaultFluxerPacing
		}
		return core.NewFluxerPacer(clk, p.Fluxer)
	}
	pacer := core.NewDiscordPacer(clk, p.MaxConcurrency)
	pacer.SetReserve(p.IdentifyReserve)
	total := p.IdentifyTotal
	if total == 0 && p.Fixed {
		// No discovery will say: Discord's documented figure, and the
		// period starts with the first identify.
		total = core.DiscordStartTotal
	}
	pacer.LimitTotal(total)
	return pacer
}

// DiscoverBeforeStart runs discovery before the first identify, for at most
// 30 s. With auto (--total auto) it is there for the recommended shard
// count and its failure is the error; otherwise a failure is logged with
// lost, what goes without it, and ok is false: the start goes on.
func DiscoverBeforeStart(ctx context.Context, flavor core.Flavor, api, token string, auto bool, log *slog.Logger, lost string) (d Discovery, ok bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	d, err = Discover(dctx, nil, flavor, api, token)
	cancel()
	switch {
	case err != nil && auto:
		return d, false, fmt.Errorf("--total auto: %w", err)
	case err != nil:
		log.Error("discovery before the start failed: "+lost, "err", err)
		return d, false, nil
	}
	if auto {
		log.Info("discovered the recommended shard count", "total", d.Shards)
	}
	return d, true, nil
}
