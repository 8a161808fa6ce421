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
	max   int

	mu     sync.Mutex
	starts []time.Duration // monotonic start times of the last max moves, oldest first
}

// NewMovePacer returns a pacer allowing max moves per MoveWindow (at least
// 1), reading time from c (nil = real time).
func NewMovePacer(c clock.Clock, max int) *MovePacer {
	if max < 1 {
		max = 1
	}
	return &MovePacer{clock: clock.Or(c), max: max}
}

// Take records a move and reports true when one may start now; otherwise
// it records nothing and returns the time until one may.
func (p *MovePacer) Take() (bool, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := clock.Mono(p.clock)
	if len(p.starts) == p.max {
		if wait := p.starts[0] + MoveWindow - now; wait > 0 {
			return false, wait
		}
		p.starts = append(p.starts[:0], p.starts[1:]...)
	}
	p.starts = append(p.starts, now)
	return true, 0
}
