package supervisor

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// GrantMargin is added to Discord's 5 s between two identifies of a
// bucket when the child has not said yet when it took the previous grant
// (Taken): a grant crosses a channel and a scheduler before the identify
// leaves, and two grants 5 s apart can reach the gateway less than 5 s
// apart when the first crossed more slowly, which the gateway answers with
// op 9 (the simulator does, strictly). Measured on 2 loaded cores: a few
// milliseconds at a load of 2, over 100 ms once in 1,000 identifies at a
// load of 7. A child reports the time it handed each grant to its gateway
// client milliseconds later, so the next grant of the bucket goes 5 s after
// that time instead, as one node's would: the margin is only the
// fallback.
const GrantMargin = 250 * time.Millisecond

// SpacedPacer is the identify pacer the children share: the core's
// pacer (its buckets, budget and reserve, as one node), with Discord's
// grants of one bucket at least DiscordWindow apart from the time the
// child took the previous one (Taken), or DiscordWindow + GrantMargin
// apart from the parent's previous grant when the child has not said.
type SpacedPacer struct {
	*core.Pacer
	discord bool
	clock   clock.Clock

	mu    sync.Mutex
	last  map[int]time.Time // by bucket: the last grant handed out
	taken map[int]time.Time // by bucket: when the child took it (Taken)
}

// NewSpacedPacer wraps p (discord: whether it paces Discord's buckets).
func NewSpacedPacer(p *core.Pacer, discord bool, c clock.Clock) *SpacedPacer {
	return &SpacedPacer{Pacer: p, discord: discord, clock: clock.Or(c), last: map[int]time.Time{}, taken: map[int]time.Time{}}
}

// Taken records that the child took shard's grant at at (its clock is
// the parent's: the same machine's). A report older than the bucket's
// last grant is stale and ignored.
func (s *SpacedPacer) Taken(shard int, at time.Time) {
	if !s.discord {
		return
	}
	key := shard % s.Pacer.MaxConcurrency()
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.last[key]; ok && !at.Before(last) {
		s.taken[key] = later(s.taken[key], at)
	}
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
			next := last.Add(core.DiscordWindow + GrantMargin)
			if tk, ok := s.taken[key]; ok && !tk.Before(last) {
				next = tk.Add(core.DiscordWindow)
			}
			at = later(now, next)
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
