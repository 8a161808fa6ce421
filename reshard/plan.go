package reshard

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// The limits of automatic resharding (DESIGN.md section 7.5).
const (
	// MaxTotal is the largest plan a move may reach: at 16,384
	// shards a further 4011 is FATAL.
	MaxTotal = 16384
	// MovesPerHour bounds the moves in any rolling hour, so that a
	// gateway that keeps closing with 4011 cannot drive the bot through
	// plan after plan, each costing a whole plan of identifies.
	MovesPerHour = 3
	// FluxerCommunitiesPerShard is how many communities one Fluxer shard of
	// a new plan is sized for: 4011 comes above 2,500, so 2,000 leaves a
	// fifth of room to grow before the next move.
	FluxerCommunitiesPerShard = 2000
)

// ErrRefused is wrapped by every refusal to move to a new plan. The old
// plan keeps serving after one.
var ErrRefused = errors.New("reshard refused")

// Split returns the shards of a plan of total newTotal that carry
// the guilds of shard k of a plan of total old, when newTotal is a
// multiple of old: k + i·old for i in [0, newTotal/old). A guild g is on
// shard g mod old before and g mod newTotal after, and (g mod newTotal)
// mod old = g mod old because old divides newTotal. Stepping by the
// multiplier instead (k·M + i), as one library does, sends a guild to a
// shard that never receives it.
func Split(k, old, newTotal int) ([]int, error) {
	switch {
	case old < 1 || newTotal < 1:
		return nil, fmt.Errorf("%w: totals %d and %d must be positive", core.ErrUsage, old, newTotal)
	case k < 0 || k >= old:
		return nil, fmt.Errorf("%w: shard %d is outside 0..%d", core.ErrUnknownShard, k, old-1)
	case newTotal%old != 0:
		return nil, fmt.Errorf("%w: %d is not a multiple of %d, so shard %d's guilds spread over shards that also carry other old shards' guilds", core.ErrUsage, newTotal, old, k)
	}
	out := make([]int, 0, newTotal/old)
	for id := k; id < newTotal; id += old {
		out = append(out, id)
	}
	return out, nil
}

// ShardOf returns the shard of a plan of total that receives guild's
// events: (guild >> 22) mod total (DESIGN.md section 3); guild 0 stands
// for direct messages and account-level traffic, which go to shard 0.
func ShardOf(guild uint64, total int) int {
	if total < 1 {
		return 0
	}
	return int((guild >> 22) % uint64(total))
}

// NextTotal decides the total of the plan that replaces one of current
// shards from what discovery answered (DESIGN.md section 7.5). Discord:
// its recommended shard count, rounded up to a multiple of
// maxConcurrency when that is above 1 (a large bot whose total is not a
// multiple is closed with 4010). Fluxer: one shard per
// FluxerCommunitiesPerShard communities, counted by the caller. An answer
// of no shards, of no more shards than now, or beyond MaxTotal is
// refused: the old plan keeps serving.
func NextTotal(flavor core.Flavor, current, answer, maxConcurrency int) (int, error) {
	next := answer
	if flavor == core.Fluxer {
		if answer < 0 {
			return 0, fmt.Errorf("%w: a community count of %d", ErrRefused, answer)
		}
		next = (answer + FluxerCommunitiesPerShard - 1) / FluxerCommunitiesPerShard
	}
	if next < 1 {
		return 0, fmt.Errorf("%w: discovery answered %d shards", ErrRefused, next)
	}
	if flavor == core.Discord && maxConcurrency > 1 && next%maxConcurrency != 0 {
		next += maxConcurrency - next%maxConcurrency
	}
	if err := checkCeiling(current); err != nil {
		return 0, err
	}
	switch {
	case next <= current:
		return 0, fmt.Errorf("%w: the new plan would have %d shards, not more than the current %d", ErrRefused, next, current)
	case next > MaxTotal:
		return 0, fmt.Errorf("%w: the new plan would have %d shards, beyond the ceiling of %d", ErrRefused, next, MaxTotal)
	}
	return next, nil
}

// checkCeiling refuses any move of a plan that has reached MaxTotal,
// whatever discovery would answer.
func checkCeiling(current int) error {
	if current >= MaxTotal {
		return fmt.Errorf("%w: the plan already has %d shards, the most a move may reach", ErrRefused, current)
	}
	return nil
}

// CheckBudget refuses a move whose new sessions the identify
// budget cannot pay for while keeping its reserve: newTotal identifies
// must fit in remaining − reserve.
func CheckBudget(newTotal, remaining, reserve int) error {
	if avail := remaining - reserve; newTotal > avail {
		return fmt.Errorf("%w: the new plan needs %d identifies and the budget has %d left above its reserve of %d", ErrRefused, newTotal, max(avail, 0), reserve)
	}
	return nil
}

// Limiter admits at most MovesPerHour moves in any rolling
// hour. Its zero value is not usable; use NewLimiter.
type Limiter struct {
	clock clock.Clock

	mu sync.Mutex
	// moves holds the monotonic start times (clock.Mono) of the moves
	// within the last hour, oldest first: a wall-clock step neither
	// frees nor blocks a move.
	moves []time.Duration
}

// NewLimiter returns a limiter reading time from c (nil: real time).
func NewLimiter(c clock.Clock) *Limiter {
	return &Limiter{clock: clock.Or(c)}
}

// Admit records a move starting now, or refuses it, saying when the
// oldest move of the hour leaves the window.
func (l *Limiter) Admit() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now, err := l.checkLocked()
	if err == nil {
		l.moves = append(l.moves, now)
	}
	return err
}

// Check returns the refusal Admit would return now, without recording a
// move: a refusal known when the operator writes `reshard N`, before the
// checks that take time.
func (l *Limiter) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.checkLocked()
	return err
}

func (l *Limiter) checkLocked() (now time.Duration, err error) {
	now = clock.Mono(l.clock)
	l.moves = slices.DeleteFunc(l.moves, func(t time.Duration) bool { return now-t >= time.Hour })
	if len(l.moves) >= MovesPerHour {
		next := l.clock.Now().Add(l.moves[0] + time.Hour - now)
		return now, fmt.Errorf("%w: %d moves in the last hour already, the most allowed; the next is allowed at %s", ErrRefused, len(l.moves), next.UTC().Format(time.RFC3339))
	}
	return now, nil
}
