package core

import (
	"time"
)

// MaxPayload is the largest command a gateway accepts, in bytes.
const MaxPayload = 4096

// SendPolicy is a connection's rolling command budget.
type SendPolicy struct {
	Limit   int           // commands per Window the gateway allows
	Window  time.Duration // rolling window
	Reserve int           // part of Limit kept for heartbeats, identify and resume, which are never delayed
	Queue   int           // operator commands that may wait for the budget
}

// The budgets of DESIGN.md section 2. Discord's heartbeat interval of
// 41.25 s needs two heartbeats a minute; one more covers identify or resume,
// and one is margin.
var (
	DiscordSend = SendPolicy{Limit: 120, Window: time.Minute, Reserve: 4, Queue: 64}
	FluxerSend  = SendPolicy{Limit: 500, Window: time.Minute, Reserve: 4, Queue: 64}
)

func (p SendPolicy) commands() int { return max(p.Limit-p.Reserve, 1) }

// sendHistory remembers when the last commands were sent, as a ring of Unix
// nanoseconds that grows on first use: shards that never send pay nothing.
type sendHistory struct {
	times []int64
	head  int // oldest entry once the ring is full
}

// allowAt returns when the next command may go.
func (h *sendHistory) allowAt(now time.Time, p SendPolicy) time.Time {
	if len(h.times) < p.commands() {
		return now
	}
	return later(now, time.Unix(0, h.times[h.head]).Add(p.Window))
}

func (h *sendHistory) record(now time.Time, p SendPolicy) {
	if n := p.commands(); len(h.times) < n {
		h.times = append(h.times, now.UnixNano())
	} else {
		h.times[h.head] = now.UnixNano()
		h.head = (h.head + 1) % n
	}
}

func (h *sendHistory) clear() { *h = sendHistory{} }
