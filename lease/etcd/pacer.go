package etcd

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// MoveWindow is the window of the move pacing: at most max_concurrency
// planned moves start per node in any MoveWindow, so a join is no identify
// storm even when resumes fail and the new owners identify afresh.
const MoveWindow = 5 * time.Second

// MovePacer paces one node's planned moves on the monotonic clock.
type MovePacer struct {
	clock clock.Clock

	mu     sync.Mutex
	max    int
	starts []time.Duration // monotonic start times of the moves within the last MoveWindow, oldest first
}

// NewMovePacer returns a pacer allowing max moves per MoveWindow (at least
// 1), reading time from c (nil = real time).
func NewMovePacer(c clock.Clock, max int) *MovePacer {
	return &MovePacer{clock: clock.Or(c), max: atLeastOne(max)}
}

func atLeastOne(n int) int { return max(n, 1) }

// SetMax changes the moves allowed per MoveWindow (at least 1): Discord's
// discovery may raise max_concurrency after the node started with the
// flag's value. Moves already started count against the new figure.
func (p *MovePacer) SetMax(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max = atLeastOne(n)
}

// Take records a move and reports true when one may start now; otherwise
// it records nothing and returns the time until one may.
func (p *MovePacer) Take() (bool, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := clock.Mono(p.clock)
	i := 0
	for i < len(p.starts) && p.starts[i]+MoveWindow <= now {
		i++
	}
	p.starts = append(p.starts[:0], p.starts[i:]...)
	if n := len(p.starts); n >= p.max {
		return false, p.starts[n-p.max] + MoveWindow - now
	}
	p.starts = append(p.starts, now)
	return true, 0
}
