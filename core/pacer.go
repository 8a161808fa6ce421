package core

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// IdentifyPacer hands out identify slots. It is an interface so that
// several nodes can share one budget.
type IdentifyPacer interface {
	// Request asks for an identify slot for shard. It returns true when the
	// shard may identify now. Otherwise grant is called once, later, from
	// another goroutine or the clock's Advance and never from within Request,
	// unless cancel is called first.
	Request(shard int, grant func()) (now bool, cancel func())
}

// StartLimit is Discord's session_start_limit.
type StartLimit struct {
	Total, Remaining int
	ResetAfter       time.Duration
	MaxConcurrency   int
}

// DiscordWindow is the time one bucket needs between two identifies.
const DiscordWindow = 5 * time.Second

// Pacer is the in-memory IdentifyPacer for one node. Requests wait in FIFO
// queues, one per rate-limit key, so a fleet started in shard order
// identifies in shard order.
//
// Discord: the key is shard % max_concurrency and each key identifies at
// most once per 5 s; no identify is granted while session_start_limit's
// remaining count is used up, until its reset_after has passed.
// Fluxer: one key; at most Budget identifies in any Window, at least Spacing
// apart. Fluxer's discovery limits are constant and are not paced from.
type Pacer struct {
	clock   clock.Clock
	discord bool

	mu sync.Mutex
	// Discord
	maxConcurrency int
	total          int // session starts per reset period; 0 = unknown, unlimited
	remaining      int
	resetAt        time.Time
	// Fluxer
	budget  int
	window  time.Duration
	spacing time.Duration
	recent  []time.Time // identify times within the window, oldest first

	queues map[int]*pacerQueue
	seq    uint64
}

type pacerQueue struct {
	key  int
	next time.Time // earliest next identify for this key (Discord)
	// The waiters form a doubly linked list, oldest first, so that a cancel
	// unlinks its waiter in O(1): "stop all" cancels every waiting request,
	// and with a slice each cancel cost a search and a shift under mu.
	head, tail *pacerWaiter
	n          int
	timer      clock.Timer
	armed      bool
}

type pacerWaiter struct {
	shard      int
	seq        uint64
	grant      func()
	q          *pacerQueue // nil once granted or cancelled
	prev, next *pacerWaiter
}

func (q *pacerQueue) push(w *pacerWaiter) {
	w.q, w.prev, w.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *pacerQueue) remove(w *pacerWaiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.q, w.prev, w.next = nil, nil, nil
	q.n--
}

// NewDiscordPacer returns a pacer for Discord's buckets. Until SetStartLimit
// says otherwise, max_concurrency is maxConcurrency (at least 1) and the
// daily start limit is unknown and not enforced.
func NewDiscordPacer(c clock.Clock, maxConcurrency int) *Pacer {
	return &Pacer{clock: clock.Or(c), discord: true, maxConcurrency: max(maxConcurrency, 1), queues: map[int]*pacerQueue{}}
}

// FluxerPacing is Fluxer's identify budget.
type FluxerPacing struct {
	Budget  int           // identifies per Window (300 at the time of writing)
	Window  time.Duration // 60 s
	Spacing time.Duration // minimum gap between two identifies of this node
}

// DefaultFluxerPacing is Fluxer's published budget with a 200 ms spacing
// that spreads a fleet's identifies over the window.
var DefaultFluxerPacing = FluxerPacing{Budget: 300, Window: time.Minute, Spacing: 200 * time.Millisecond}

// NewFluxerPacer returns a pacer for Fluxer's budget.
func NewFluxerPacer(c clock.Clock, p FluxerPacing) *Pacer {
	if p.Budget < 1 {
		p = DefaultFluxerPacing
	}
	return &Pacer{clock: clock.Or(c), budget: p.Budget, window: p.Window, spacing: p.Spacing, queues: map[int]*pacerQueue{}}
}

// SetStartLimit applies Discord's session_start_limit from discovery. A
// changed max_concurrency re-buckets the waiting requests, keeping their
// order. Fluxer pacers ignore it.
func (p *Pacer) SetStartLimit(l StartLimit) {
	if !p.discord {
		return
	}
	p.mu.Lock()
	now := p.clock.Now()
	p.total, p.remaining = l.Total, l.Remaining
	p.resetAt = now.Add(l.ResetAfter)
	if mc := max(l.MaxConcurrency, 1); mc != p.maxConcurrency {
		p.maxConcurrency = mc
		var all []*pacerWaiter
		for _, q := range p.queues {
			for w := q.head; w != nil; w = w.next {
				all = append(all, w)
			}
			if q.armed {
				q.timer.Stop()
			}
		}
		slices.SortFunc(all, func(a, b *pacerWaiter) int { return cmp.Compare(a.seq, b.seq) })
		old := p.queues
		p.queues = map[int]*pacerQueue{}
		for key, q := range old {
			if key < mc {
				p.queues[key] = &pacerQueue{key: key, next: q.next}
			}
		}
		for _, w := range all {
			p.queue(w.shard).push(w)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(p.queues)) {
		q := p.queues[key]
		q.armed = false
		p.schedule(q, now)
	}
	p.mu.Unlock()
}

// Request implements IdentifyPacer.
func (p *Pacer) Request(shard int, grant func()) (bool, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	q := p.queue(shard)
	if q.n == 0 && !p.allowAt(q, now).After(now) {
		p.take(q, now)
		return true, func() {}
	}
	p.seq++
	w := &pacerWaiter{shard: shard, seq: p.seq, grant: grant}
	q.push(w)
	p.schedule(q, now)
	return false, func() { p.cancel(w) }
}

// MaxConcurrency returns Discord's max_concurrency in force (1 for Fluxer).
func (p *Pacer) MaxConcurrency() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.discord {
		return 1
	}
	return p.maxConcurrency
}

// Waiting returns the number of queued requests and the time of the next
// grant (zero when none is queued).
func (p *Pacer) Waiting() (n int, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	for _, q := range p.queues {
		if q.n == 0 {
			continue
		}
		n += q.n
		if at := p.allowAt(q, now); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return n, next
}

// DrainTime estimates how long until every queued request is granted, if
// nothing else is queued meanwhile.
func (p *Pacer) DrainTime() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	var worst time.Duration
	for _, q := range p.queues {
		n := q.n
		if n == 0 {
			continue
		}
		d := p.allowAt(q, now).Sub(now)
		if p.discord {
			d += time.Duration(n-1) * DiscordWindow
		} else {
			// Every further identify needs its spacing, and the budget
			// refills one window at a time.
			d += time.Duration(n-1) * p.spacing
			if over := n - p.budget; over > 0 {
				d = max(d, time.Duration((over+p.budget-1)/p.budget)*p.window)
			}
		}
		worst = max(worst, d)
	}
	return worst
}

func (p *Pacer) key(shard int) int {
	if p.discord {
		return shard % p.maxConcurrency
	}
	return 0
}

func (p *Pacer) queue(shard int) *pacerQueue {
	k := p.key(shard)
	q := p.queues[k]
	if q == nil {
		q = &pacerQueue{key: k}
		p.queues[k] = q
	}
	return q
}

// allowAt returns the earliest time, not before now, at which q may
// identify.
func (p *Pacer) allowAt(q *pacerQueue, now time.Time) time.Time {
	t := now
	if p.discord {
		t = later(t, q.next)
		if p.total > 0 && p.remaining <= 0 && now.Before(p.resetAt) {
			t = later(t, p.resetAt)
		}
		return t
	}
	if n := len(p.recent); n > 0 {
		t = later(t, p.recent[n-1].Add(p.spacing))
	}
	// Drop identifies that left the window as of t; if the budget is still
	// used up, wait until the oldest one leaves.
	for {
		i := 0
		for i < len(p.recent) && !p.recent[i].Add(p.window).After(t) {
			i++
		}
		if len(p.recent)-i < p.budget {
			return t
		}
		t = p.recent[i].Add(p.window)
	}
}

func (p *Pacer) take(q *pacerQueue, now time.Time) {
	if p.discord {
		q.next = now.Add(DiscordWindow)
		if p.total > 0 {
			if !now.Before(p.resetAt) {
				// A new period began; discovery will correct the figures.
				p.remaining = p.total
				p.resetAt = now.Add(24 * time.Hour)
			}
			p.remaining--
		}
		return
	}
	i := 0
	for i < len(p.recent) && !p.recent[i].Add(p.window).After(now) {
		i++
	}
	p.recent = append(p.recent[i:], now)
}

func (p *Pacer) schedule(q *pacerQueue, now time.Time) {
	if q.armed || q.n == 0 {
		return
	}
	d := p.allowAt(q, now).Sub(now)
	if q.timer == nil {
		q.timer = p.clock.AfterFunc(d, func() { p.fire(q) })
	} else {
		q.timer.Reset(d)
	}
	q.armed = true
}

func (p *Pacer) fire(q *pacerQueue) {
	p.mu.Lock()
	q.armed = false
	if p.queues[q.key] != q || q.n == 0 {
		p.mu.Unlock()
		return
	}
	now := p.clock.Now()
	if p.allowAt(q, now).After(now) {
		p.schedule(q, now)
		p.mu.Unlock()
		return
	}
	p.take(q, now)
	w := q.head
	q.remove(w)
	p.schedule(q, now)
	p.mu.Unlock()
	w.grant()
}

func (p *Pacer) cancel(w *pacerWaiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A waiter already granted, or re-bucketed and then granted, has no
	// queue: cancelling it is a no-op, as the interface promises.
	if w.q != nil {
		w.q.remove(w)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
