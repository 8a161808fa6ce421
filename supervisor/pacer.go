package supervisor

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// GrantMargin is added to Discord's 5 s between two identifies of a
// bucket when the slots go to children: a grant crosses a channel and a
// scheduler before the identify leaves, and two grants 5 s apart can
// reach the gateway less than 5 s apart when the first crossed more
// slowly, which the gateway answers with op 9 (the simulator does,
// strictly). Measured on 2 loaded cores: a few milliseconds at a load of
// 2, over 100 ms once in 1,000 identifies at a load of 7. 250 ms costs 5%
// of a long start, 200 ms a round more than one node (whose gateway client
// spaces its own identifies 5 s + 50 ms apart from their writes).
//
// Pacing from when the child took the grant instead (reported on the
// channel) was tried and refused: the identify leaves only once its
// connection is dialled, upgraded and greeted, which differs between
// connections by more than the margin, and each child's gateway client
// spaces only its own writes; the simulator refused identifies of two
// children in one bucket less than 5 s apart. Pacing from the writes
// needs the gateway client to report them.
const GrantMargin = 250 * time.Millisecond

// SpacedPacer is the identify pacer the children share: the core's
// pacer (its buckets, budget and reserve, as one node), with Discord's
// grants of one bucket at least DiscordWindow + GrantMargin apart.
type SpacedPacer struct {
	*core.Pacer
	discord bool
	clock   clock.Clock

	mu   sync.Mutex
	last map[int]time.Time // by bucket: the last grant handed out
}

// NewSpacedPacer wraps p (discord: whether it paces Discord's buckets).
func NewSpacedPacer(p *core.Pacer, discord bool, c clock.Clock) *SpacedPacer {
	return &SpacedPacer{Pacer: p, discord: discord, clock: clock.Or(c), last: map[int]time.Time{}}
}

// Request is core.IdentifyPacer's.
func (s *SpacedPacer) Request(shard int, operator bool, grant func()) (bool, func()) {
	if !s.discord {
		return s.Pacer.Request(shard, operator, grant)
	}
	var (
		mu        sync.Mutex
		cancelled bool
		timer     clock.Timer
	)
	// hold returns how long the grant must wait still, and books it.
	hold := func() time.Duration {
		key := shard % s.Pacer.MaxConcurrency()
		now := s.clock.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		at := now
		if last, ok := s.last[key]; ok {
			at = later(now, last.Add(core.DiscordWindow+GrantMargin))
		}
		s.last[key] = at
		return at.Sub(now)
	}
	later := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if !cancelled {
			timer = s.clock.AfterFunc(d, grant)
		}
	}
	now, cancel := s.Pacer.Request(shard, operator, func() {
		if d := hold(); d > 0 {
			later(d)
			return
		}
		grant()
	})
	if now {
		if d := hold(); d > 0 {
			later(d)
			now = false
		}
	}
	return now, func() {
		mu.Lock()
		cancelled = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
