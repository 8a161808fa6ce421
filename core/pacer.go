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
// several nodes can share one budget (the etcd pacer implements it too).
type IdentifyPacer interface {
	// Request asks for an identify slot for shard. It returns true when the
	// shard may identify now. Otherwise grant is called once, later, from
	// another goroutine or the clock's Advance and never from within Request,
	// unless cancel is called first. operator marks a request made by an
	// operator's command (identify, retry): it may spend the reserve, and
	// it goes ahead of the automatic requests waiting with it.
	Request(shard int, operator bool, grant func()) (now bool, cancel func())
	// BudgetWait returns, while the identify budget (not a bucket's pacing)
	// holds back a request of that kind, when it lets the next one
	// through; zero otherwise. A shard's diagnostics call it under that
	// shard's lock, as Request is: it must answer from memory, at once.
	BudgetWait(operator bool) time.Time
}

// SlotDeadliner is an IdentifyPacer whose slots must be used by a
// deadline: a pacer shared across nodes (lease/etcd/identify) spaces one
// bucket's identifies only if each goes out soon enough after its slot
// began. The core asks it right after a grant (or a Request that answered
// now) and carries the answer in the Attempt (Attempt.IdentifyBy).
type SlotDeadliner interface {
	// IdentifyBy returns, for the slot last granted to shard, the
	// monotonic reading (clock.Mono) by which its identify must be
	// written, and a func that gives the slot's start back when it was
	// not; ok is false when the slot has no deadline.
	IdentifyBy(shard int) (by time.Duration, unused func(), ok bool)
}

// StartLimit is Discord's session_start_limit.
type StartLimit struct {
	Total, Remaining int
	ResetAfter       time.Duration
	MaxConcurrency   int
}

// DiscordWindow is the time one bucket needs between two identifies.
const DiscordWindow = 5 * time.Second

// Discord's documented session start limit of a bot that has not been
// told otherwise, the figure used when discovery is skipped.
const (
	DiscordStartTotal  = 1000
	DiscordStartPeriod = 24 * time.Hour
)

// startMargin bounds how long after its slot an identify reaches the
// gateway (dial, TLS, upgrade and Hello are bounded by the transport's
// timeouts, 30 s and 20 s). A reset time this pacer guesses (the period
// starts with an identify the gateway counts when it arrives) lies that
// much later, and the slots granted that close before a reset still count
// after it: the gateway may count them in its new period.
const startMargin = time.Minute

// Pacer is the in-memory IdentifyPacer for one node. Requests wait in FIFO
// queues, one per rate-limit key, so a fleet started in shard order
// identifies in shard order; an operator's request goes ahead of the
// automatic ones of its queue.
//
// Discord: the key is shard % max_concurrency and each key identifies at
// most once per 5 s. The session start budget is counted here, and only
// here is it trusted:
//
//   - remaining goes down by one at every slot granted, when the slot is
//     granted (not at READY: an identify in flight counts);
//   - it goes up only when the clock reaches the reset time (resetAt <=
//     now): then it is the total again, less the slots granted in the
//     minute before (they may reach the gateway in its new period);
//   - a discovery answer (SetStartLimit) may lower remaining, and sets the
//     reset time when none is known, but never raises remaining nor moves
//     a known reset time: the gateway's figure may lag the identifies in
//     flight, and the first answer, which may come after some slots were
//     granted (a connection discovers after its slot), is taken less those
//     grants;
//   - an answer with nothing used leaves the reset time unknown (the
//     gateway's period starts with the identify it counts next); a reset
//     time the pacer sets itself, at the first grant of a period, lies a
//     period and a minute (startMargin) after it;
//   - automatic requests never spend the last Reserve starts (default 1%
//     of the total, at least 1, less than the total); an operator's may.
//
// Until a total is known (from discovery or LimitTotal) nothing is
// enforced but the grants are counted, so the binary discovers before it
// starts the shards; only when that fails do the first slots (one per
// bucket) go out before the figure is known. Events at 50% and 80% used and at
// the reserve go, once each per reset period, to the function given to
// SetBudgetNotify.
//
// Fluxer: one key; at most Budget identifies in any Window, at least Spacing
// apart, and no reserve (the window refills within a minute). Fluxer's
// discovery limits are constant and are not paced from.
type Pacer struct {
	clock   clock.Clock
	discord bool

	mu sync.Mutex
	// Discord
	maxConcurrency int
	total          int // session starts per reset period; 0 = unknown, unlimited
	ceiling        int // LimitTotal: the total never goes above it (0 = none)
	remaining      int
	resetAt        time.Time   // zero: unknown, the period starts at the next grant
	unknownUsed    int         // slots granted while the total was unknown
	lately         []time.Time // grant times within startMargin, oldest first
	reserve        int         // -1: the default
	notified       uint8       // the thresholds already reported this period
	notify         func(BudgetNote)
	// Fluxer
	budget  int
	window  time.Duration
	spacing time.Duration
	recent  []time.Time // identify times within the window, oldest first

	day    dayCount
	queues map[int]*pacerQueue
	seq    uint64
}

// BudgetNote reports a threshold of the session start budget crossed.
type BudgetNote struct {
	// Shard is the shard whose slot crossed it, -1 for a discovery answer.
	Shard int
	// Mark is "50%", "80%" (of the total used) or "reserve" (no start
	// left but the reserve).
	Mark                   string
	Used, Total, Remaining int
	ResetAt                time.Time
}

const (
	noted50 uint8 = 1 << iota
	noted80
	notedReserve
)

// Budget is what /identify shows.
type Budget struct {
	// Total is the session starts per period (Fluxer: per window); 0 when
	// not known yet.
	Total, Remaining int
	// ResetAt is when Remaining is the total again (Fluxer: when the
	// oldest identify in the window leaves it); zero when not known.
	ResetAt time.Time
	// Used24h counts the slots this pacer granted in the last 24 hours.
	Used24h        int
	Reserve        int
	MaxConcurrency int
	// Waiting requests, and the time of the next grant (zero if none).
	Waiting  int
	NextSlot time.Time
}

type pacerQueue struct {
	key  int
	next time.Time // earliest next identify for this key (Discord)
	// The waiters form a doubly linked list, oldest first, so that a cancel
	// unlinks its waiter in O(1): "stop all" cancels every waiting request,
	// and with a slice each cancel cost a search and a shift under mu.
	head, tail *pacerWaiter
	lastOp     *pacerWaiter // the operators' requests come first
	n          int
	timer      clock.Timer
	armed      bool
}

type pacerWaiter struct {
	shard      int
	operator   bool
	seq        uint64
	grant      func()
	q          *pacerQueue // nil once granted or cancelled
	prev, next *pacerWaiter
}

// push queues w: an operator's request after the operators' requests
// already waiting and before every automatic one, an automatic one last.
func (q *pacerQueue) push(w *pacerWaiter) {
	if w.operator {
		q.insertAfter(q.lastOp, w)
		q.lastOp = w
		return
	}
	q.insertAfter(q.tail, w)
}

// insertAfter links w in after prev; a nil prev puts it first.
func (q *pacerQueue) insertAfter(prev, w *pacerWaiter) {
	w.q, w.prev = q, prev
	if prev != nil {
		w.next = prev.next
		prev.next = w
	} else {
		w.next = q.head
		q.head = w
	}
	if w.next != nil {
		w.next.prev = w
	} else {
		q.tail = w
	}
	q.n++
}

func (q *pacerQueue) remove(w *pacerWaiter) {
	if q.lastOp == w {
		q.lastOp = w.prev // an operator's too, or nil
	}
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
	return &Pacer{clock: clock.Or(c), discord: true, maxConcurrency: max(maxConcurrency, 1), reserve: -1, queues: map[int]*pacerQueue{}}
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

// SetStartLimit applies Discord's session_start_limit from discovery,
// under the rules of the type's doc: it may lower remaining, never raise
// it. A changed max_concurrency re-buckets the waiting requests, keeping
// their order. Fluxer pacers ignore it.
func (p *Pacer) SetStartLimit(l StartLimit) {
	if !p.discord {
		return
	}
	p.mu.Lock()
	now := p.clock.Now()
	p.rollLocked(now)
	if l.Total > 0 {
		total := l.Total
		if p.ceiling > 0 {
			total = min(total, p.ceiling)
		}
		rem := max(min(l.Remaining, total), 0)
		if p.resetAt.IsZero() {
			switch {
			case l.Remaining < l.Total && l.ResetAfter > 0:
				// The gateway's period has begun: its end is fixed.
				p.resetAt = now.Add(l.ResetAfter)
			case l.Remaining < l.Total || p.total == 0 && p.unknownUsed > 0:
				// Begun, at the latest with our grants, before now.
				p.resetAt = now.Add(DiscordStartPeriod + startMargin)
			}
			// Otherwise nothing is used: the period starts with the
			// next identify, and take sets the time.
		}
		if p.total == 0 {
			// The first figure: slots granted before it may not be in it.
			p.remaining = max(rem-p.unknownUsed, 0)
			p.unknownUsed = 0
		} else {
			p.remaining = min(p.remaining, rem)
		}
		p.total = total
		p.noteLocked(-1)
	}
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

// LimitTotal sets the session start total when discovery is skipped
// (Discord's documented DiscordStartTotal unless the operator says
// otherwise), or caps what discovery says. With no total known yet, the
// full total remains, less the slots already granted, and the period
// starts at the next grant. Fluxer pacers ignore it.
func (p *Pacer) LimitTotal(total int) {
	if !p.discord || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ceiling = total
	if p.total == 0 {
		p.total, p.remaining = total, max(total-p.unknownUsed, 0)
		if p.unknownUsed > 0 && p.resetAt.IsZero() {
			// The period began with those grants, before now.
			p.resetAt = p.clock.Now().Add(DiscordStartPeriod + startMargin)
		}
		p.unknownUsed = 0
	} else {
		p.total, p.remaining = min(p.total, total), min(p.remaining, total)
	}
	p.noteLocked(-1)
}

// SetReserve sets the starts automatic requests never spend; negative
// means the default, 1% of the total, at least 1 and less than the total.
func (p *Pacer) SetReserve(n int) {
	p.mu.Lock()
	p.reserve = n
	p.mu.Unlock()
}

// SetBudgetNotify sets the function told of the budget's thresholds. It is
// called with the pacer's lock held: it must not call the pacer.
func (p *Pacer) SetBudgetNotify(f func(BudgetNote)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

func (p *Pacer) reserveLocked() int {
	if !p.discord || p.total == 0 {
		return 0
	}
	if p.reserve >= 0 {
		return min(p.reserve, p.total)
	}
	return min(max(p.total/100, 1), p.total-1)
}

// rollLocked starts a new period once the clock has reached the reset
// time: the only way remaining goes up.
func (p *Pacer) rollLocked(now time.Time) {
	if p.total == 0 || p.resetAt.IsZero() || now.Before(p.resetAt) {
		return
	}
	p.remaining, p.notified = p.total, 0
	reset := p.resetAt
	p.resetAt = time.Time{}
	for _, t := range p.lately {
		if !t.Before(reset.Add(-startMargin)) {
			if p.resetAt.IsZero() {
				p.resetAt = t.Add(DiscordStartPeriod + startMargin)
			}
			p.remaining--
		}
	}
}

// noteLocked reports the thresholds newly crossed.
func (p *Pacer) noteLocked(shard int) {
	if p.total == 0 || p.notify == nil {
		return
	}
	used := p.total - p.remaining
	for _, m := range []struct {
		bit  uint8
		mark string
		hit  bool
	}{
		{noted50, "50%", used*2 >= p.total},
		{noted80, "80%", used*5 >= p.total*4},
		{notedReserve, "reserve", p.remaining <= p.reserveLocked()},
	} {
		if m.hit && p.notified&m.bit == 0 {
			p.notified |= m.bit
			p.notify(BudgetNote{Shard: shard, Mark: m.mark, Used: used, Total: p.total, Remaining: p.remaining, ResetAt: p.resetAt})
		}
	}
}

// Request implements IdentifyPacer.
func (p *Pacer) Request(shard int, operator bool, grant func()) (bool, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	p.rollLocked(now)
	q := p.queue(shard)
	if (q.n == 0 || operator && q.lastOp == nil) && !p.allowAt(q, now, operator).After(now) {
		p.take(q, now, shard)
		return true, func() {}
	}
	p.seq++
	w := &pacerWaiter{shard: shard, operator: operator, seq: p.seq, grant: grant}
	q.push(w)
	if q.armed && q.head == w {
		// A new head, perhaps allowed sooner than the one it passed.
		q.timer.Stop()
		q.armed = false
	}
	p.schedule(q, now)
	return false, func() { p.cancel(w) }
}

// BudgetWait implements IdentifyPacer.
func (p *Pacer) BudgetWait(operator bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	p.rollLocked(now)
	at := p.budgetAt(now, operator)
	if !at.After(now) {
		return time.Time{}
	}
	return at
}

// Budget returns the figures of /identify.
func (p *Pacer) Budget() Budget {
	p.mu.Lock()
	now := p.clock.Now()
	p.day.advance(now)
	b := Budget{Used24h: p.day.sum, MaxConcurrency: 1}
	if p.discord {
		p.rollLocked(now)
		b.Total, b.Remaining, b.ResetAt, b.Reserve, b.MaxConcurrency = p.total, p.remaining, p.resetAt, p.reserveLocked(), p.maxConcurrency
	} else {
		i := p.windowStart(now)
		b.Total, b.Remaining = p.budget, max(p.budget-(len(p.recent)-i), 0)
		if i < len(p.recent) {
			b.ResetAt = p.recent[i].Add(p.window)
		}
	}
	p.mu.Unlock()
	b.Waiting, b.NextSlot = p.Waiting()
	return b
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
		if at := p.allowAt(q, now, q.head.operator); next.IsZero() || at.Before(next) {
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
		d := p.allowAt(q, now, q.head.operator).Sub(now)
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
// identify a request of that kind.
func (p *Pacer) allowAt(q *pacerQueue, now time.Time, operator bool) time.Time {
	if p.discord {
		return later(later(now, q.next), p.budgetAt(now, operator))
	}
	return p.budgetAt(now, false)
}

// budgetAt returns the earliest time, not before now, at which the budget
// lets a request of that kind through, whatever its bucket.
func (p *Pacer) budgetAt(now time.Time, operator bool) time.Time {
	if p.discord {
		floor := 0
		if !operator {
			floor = p.reserveLocked()
		}
		if p.total == 0 || p.remaining > floor {
			return now
		}
		switch {
		case p.resetAt.IsZero():
			// Only a reserve of the whole total gets here: nothing
			// automatic ever starts a period.
			return now.Add(DiscordStartPeriod)
		case !p.resetAt.After(now):
			return now // reached: rollLocked raises remaining first
		}
		return p.resetAt
	}
	t := now
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

// windowStart is the index of the oldest identify still in the window.
func (p *Pacer) windowStart(now time.Time) int {
	i := 0
	for i < len(p.recent) && !p.recent[i].Add(p.window).After(now) {
		i++
	}
	return i
}

func (p *Pacer) take(q *pacerQueue, now time.Time, shard int) {
	p.day.add(now)
	if p.discord {
		q.next = now.Add(DiscordWindow)
		p.rollLocked(now)
		if p.total == 0 {
			p.unknownUsed++
			return
		}
		if p.resetAt.IsZero() {
			p.resetAt = now.Add(DiscordStartPeriod + startMargin)
		}
		p.remaining--
		i := 0
		for i < len(p.lately) && !p.lately[i].Add(startMargin).After(now) {
			i++
		}
		p.lately = append(p.lately[i:], now)
		p.noteLocked(shard)
		return
	}
	i := p.windowStart(now)
	p.recent = append(p.recent[i:], now)
}

func (p *Pacer) schedule(q *pacerQueue, now time.Time) {
	if q.armed || q.n == 0 {
		return
	}
	d := p.allowAt(q, now, q.head.operator).Sub(now)
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
	p.rollLocked(now)
	w := q.head
	if p.allowAt(q, now, w.operator).After(now) {
		p.schedule(q, now)
		p.mu.Unlock()
		return
	}
	p.take(q, now, w.shard)
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

// dayCount counts grants over the last 24 hours in one-minute buckets.
type dayCount struct {
	min  [24 * 60]int32
	last int64 // the minute of the newest bucket
	sum  int
}

func (d *dayCount) advance(now time.Time) {
	m := now.Unix() / 60
	switch {
	case d.sum == 0:
	case m-d.last >= int64(len(d.min)):
		d.min, d.sum = [len(d.min)]int32{}, 0
	default:
		for i := d.last + 1; i <= m; i++ {
			k := i % int64(len(d.min))
			d.sum -= int(d.min[k])
			d.min[k] = 0
		}
	}
	d.last = max(d.last, m)
}

func (d *dayCount) add(now time.Time) {
	d.advance(now)
	d.min[d.last%int64(len(d.min))]++
	d.sum++
}
