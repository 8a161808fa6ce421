package identify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	leaseetcd "github.com/shardfs/shardfs/lease/etcd"
)

// Defaults of Config (DESIGN 7.3).
const (
	DefaultKeyTTL = 7 * time.Second
	DefaultHold   = 1500 * time.Millisecond
	DefaultRetry  = time.Second
)

// startMargin: a reset time guessed at a period's first slot lies this much
// after a day, as in core.Pacer (the gateway counts the identify when it
// arrives, up to a minute after its slot).
const startMargin = time.Minute

// readTimeout bounds a read of the bucket and counter keys.
const readTimeout = 5 * time.Second

// Config describes one node's pacer.
type Config struct {
	Client *clientv3.Client
	// Prefix is the bot's folder (etcd.Prefix(bot)); the keys live under
	// Prefix + "identify/".
	Prefix string
	// Node is written as the keys' value, so that an operator sees who
	// holds a bucket.
	Node           string
	MaxConcurrency int // at least 1
	// Total is the session starts per period until discovery's answer
	// (SetStartLimit) says (0 = core.DiscordStartTotal); without discovery
	// (--gateway) it stays.
	Total int
	// Ceiling caps what discovery says (--identify-total); 0 = none.
	Ceiling int
	// KeyTTL is the bucket key's lease, whole seconds, at least 2 s (etcd's
	// minimum); 0 = DefaultKeyTTL. It must exceed Hold.
	KeyTTL time.Duration
	// Hold is how long after its acquisition began a slot may still be
	// handed out; 0 = DefaultHold.
	Hold time.Duration
	// Retry bounds the wait between two attempts when no watch event comes;
	// 0 = DefaultRetry.
	Retry  time.Duration
	Clock  clock.Clock  // nil = real time
	Logger *slog.Logger // nil = slog.Default()
}

// Pacer is a core.IdentifyPacer shared by the nodes of one bot through etcd.
type Pacer struct {
	kv         clientv3.KV
	leases     clientv3.Lease
	watcher    clientv3.Watcher
	dir        string // Prefix + "identify/"
	counterKey string
	node       string
	keySecs    int64
	hold       time.Duration
	retry      time.Duration
	clock      clock.Clock
	log        *slog.Logger
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	beforeTxn  func()     // test hook: runs before the create transaction
	attempt    sync.Mutex // held by one worker's attempt at a time

	mu         sync.Mutex
	closed     bool
	mc         int
	ceiling    int
	total      int
	reserve    int // -1: the default
	floorUsed  int // from discovery: starts used until floorUntil
	floorUntil time.Time
	counter    counterView
	queues     map[int]*queue
	slots      map[int]slotGrant        // by shard: the last slot granted, until the core asks (IdentifyBy)
	releases   map[clock.Timer]struct{} // Written's timers, stopped by Close
	issued     map[int]slotGrant        // by shard: the last slot granted, until its identify is written (Written) or its key's lease has run out
	seq        uint64
}

// counterView is the budget counter as last seen.
type counterView struct {
	present bool
	used    int
	reset   time.Time
	modRev  int64
	lease   clientv3.LeaseID
	rev     int64 // the revision at which it was seen
}

// live reports whether the counter counts: whenever etcd holds it. The
// period ends when etcd expires the counter's lease, never by a node's
// clock (DESIGN 7.3): a node whose clock runs a day ahead would otherwise
// start a new period at will and spend the budget again. reset, the
// writer's guess of the period's end, is only shown and waited for.
func (c counterView) live() bool { return c.present }

// slotGrant is what a granted slot asks of its identify (SlotDeadliner).
type slotGrant struct {
	by    time.Duration // clock.Mono reading the identify must go out by
	reset time.Time     // the period the slot's start was counted in
	// lease holds the bucket key of the slot, and ends by at the latest.
	lease clientv3.LeaseID
	ends  time.Duration // clock.Mono reading: the slot's start + the key's TTL
}

type queue struct {
	bucket    int
	waiters   []*waiter // operators' requests first, then FIFO
	kick      chan struct{}
	heldUntil time.Time // a slot acquired with no waiter left to take it
	held      slotGrant // of that slot
	running   bool      // a worker is on it
}

type waiter struct {
	shard    int
	operator bool
	seq      uint64
	grant    func()
	q        *queue // nil once granted or cancelled
}

var _ core.IdentifyPacer = (*Pacer)(nil)

// New returns a pacer and starts its watch. Close stops it.
func New(cfg Config) (*Pacer, error) {
	if cfg.Client == nil {
		return nil, errors.New("identify: no etcd client")
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("identify: prefix %q does not end in /", cfg.Prefix)
	}
	ttl := cmpOr(cfg.KeyTTL, DefaultKeyTTL)
	secs := int64((ttl + time.Second - 1) / time.Second)
	hold := cmpOr(cfg.Hold, DefaultHold)
	if secs < 2 {
		return nil, fmt.Errorf("identify: key TTL %v below etcd's minimum of 2s", ttl)
	}
	if hold >= time.Duration(secs)*time.Second {
		return nil, fmt.Errorf("identify: hold %v not below the key TTL %ds", hold, secs)
	}
	total := cfg.Total
	if total <= 0 {
		total = core.DiscordStartTotal
	}
	p := &Pacer{
		kv: leaseetcd.RequireLeader(cfg.Client), leases: cfg.Client, watcher: cfg.Client,
		dir: cfg.Prefix + "identify/", node: cfg.Node,
		keySecs: secs, hold: hold, retry: cmpOr(cfg.Retry, DefaultRetry),
		clock: clock.Or(cfg.Clock), log: cfg.Logger,
		mc: max(cfg.MaxConcurrency, 1), ceiling: max(cfg.Ceiling, 0), total: total, reserve: -1,
		queues: map[int]*queue{}, slots: map[int]slotGrant{}, issued: map[int]slotGrant{}, releases: map[clock.Timer]struct{}{},
	}
	p.counterKey = p.dir + "starts"
	if p.log == nil {
		p.log = slog.Default()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.watch()
	return p, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Close stops the pacer: waiting requests are never granted. The bucket
// keys it holds are left to expire.
func (p *Pacer) Close() {
	p.mu.Lock()
	p.closed = true
	for t := range p.releases {
		t.Stop()
	}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
}

// SetReserve sets the starts automatic requests never spend; negative
// means the default.
func (p *Pacer) SetReserve(n int) {
	p.mu.Lock()
	p.reserve = n
	p.mu.Unlock()
}

// SetStartLimit applies Discord's session_start_limit from discovery: the
// total becomes discovery's (capped by Config.Ceiling), and the used count
// may be raised, never lowered (see the package doc). A changed
// max_concurrency re-buckets the waiting requests, keeping their order.
func (p *Pacer) SetStartLimit(l core.StartLimit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	if l.Total > 0 {
		p.total = l.Total
		if p.ceiling > 0 {
			p.total = min(p.total, p.ceiling)
		}
		used := l.Total - max(min(l.Remaining, l.Total), 0)
		if !now.Before(p.floorUntil) {
			p.floorUsed, p.floorUntil = 0, time.Time{}
		}
		if used > p.floorUsed && l.ResetAfter > 0 {
			if p.floorUntil.IsZero() {
				p.floorUntil = now.Add(l.ResetAfter)
			}
			p.floorUsed = used
		}
	}
	if mc := max(l.MaxConcurrency, 1); mc != p.mc {
		p.mc = mc
		var all []*waiter
		for _, q := range p.queues {
			all = append(all, q.waiters...)
			q.waiters = nil
		}
		slices.SortFunc(all, func(a, b *waiter) int { return cmp.Compare(a.seq, b.seq) })
		for b := range p.queues {
			if b >= mc {
				delete(p.queues, b)
			}
		}
		for _, w := range all {
			p.pushLocked(w)
		}
	}
	p.kickAllLocked()
}

func (p *Pacer) reserveLocked() int {
	if p.reserve >= 0 {
		return min(p.reserve, p.total)
	}
	return min(max(p.total/100, 1), p.total-1)
}

func (p *Pacer) limitLocked(operator bool) int {
	if operator {
		return p.total
	}
	return p.total - p.reserveLocked()
}

// usedLocked is the count a slot is checked against: the counter's, or
// discovery's when higher.
func (p *Pacer) usedLocked(c counterView, now time.Time) int {
	used := 0
	if c.live() {
		used = c.used
	}
	if now.Before(p.floorUntil) {
		used = max(used, p.floorUsed)
	}
	return used
}

// Request implements core.IdentifyPacer. It never calls etcd.
func (p *Pacer) Request(shard int, operator bool, grant func()) (bool, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false, func() {}
	}
	q := p.queueLocked(shard % p.mc)
	if len(q.waiters) == 0 && p.clock.Now().Before(q.heldUntil) {
		// A slot this node acquired and still holds, already counted.
		q.heldUntil = time.Time{}
		p.slots[shard] = q.held
		p.issueLocked(shard, q.held)
		return true, func() {}
	}
	p.seq++
	w := &waiter{shard: shard, operator: operator, seq: p.seq, grant: grant}
	p.pushLocked(w)
	return false, func() { p.drop(w) }
}

func (p *Pacer) queueLocked(b int) *queue {
	q := p.queues[b]
	if q == nil {
		q = &queue{bucket: b, kick: make(chan struct{}, 1)}
		p.queues[b] = q
	}
	return q
}

func (p *Pacer) pushLocked(w *waiter) {
	q := p.queueLocked(w.shard % p.mc)
	i := len(q.waiters)
	if w.operator {
		i = 0
		for i < len(q.waiters) && q.waiters[i].operator {
			i++
		}
	}
	q.waiters = slices.Insert(q.waiters, i, w)
	w.q = q
	if !q.running && !p.closed {
		q.running = true
		p.wg.Add(1)
		go p.work(q)
	}
}

func (p *Pacer) drop(w *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := w.q; q != nil {
		if i := slices.Index(q.waiters, w); i >= 0 {
			q.waiters = slices.Delete(q.waiters, i, i+1)
		}
		w.q = nil
	}
}

// BudgetWait implements core.IdentifyPacer from the counter last seen.
func (p *Pacer) BudgetWait(operator bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	if p.usedLocked(p.counter, now) < p.limitLocked(operator) {
		return time.Time{}
	}
	var at time.Time
	if p.counter.live() && p.counter.used >= p.limitLocked(operator) {
		at = p.counter.reset
	}
	if now.Before(p.floorUntil) && p.floorUsed >= p.limitLocked(operator) {
		at = later(at, p.floorUntil)
	}
	if !at.After(now) {
		// Expired but not yet seen gone: a moment more.
		return now.Add(p.retry)
	}
	return at
}

// Waiting returns the number of requests waiting on this node.
func (p *Pacer) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.queues {
		n += len(q.waiters)
	}
	return n
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func kick(q *queue) {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (p *Pacer) kickAllLocked() {
	for _, q := range p.queues {
		kick(q)
	}
}

// work acquires slots for q while it has waiters.
func (p *Pacer) work(q *queue) {
	defer p.wg.Done()
	quick := 0
	for {
		p.mu.Lock()
		if p.closed || p.queues[q.bucket] != q || len(q.waiters) == 0 {
			q.running = false
			p.mu.Unlock()
			return
		}
		op := q.waiters[0].operator
		p.mu.Unlock()
		again, err := p.try(q, op)
		if err != nil {
			p.log.Warn("identify: "+err.Error(), "bucket", q.bucket)
		}
		if again && quick < 3 {
			// The counter moved under us: read again at once.
			quick++
			continue
		}
		quick = 0
		t := p.clock.AfterFunc(p.retry, func() { kick(q) })
		select {
		case <-q.kick:
		case <-p.ctx.Done():
		}
		t.Stop()
	}
}

// try makes one attempt at q's slot; again reports a race lost on the
// counter, worth another read at once. The attempts of one node take
// turns: they all write the one counter, so at most one of them could
// win a round, and on a loaded machine the losers' calls (a read, a
// lease grant, a refused create and a revoke each) slowed the winner
// past its hold, round after round.
func (p *Pacer) try(q *queue, operator bool) (again bool, err error) {
	p.attempt.Lock()
	w, again, err := p.attemptLocked(q, operator)
	p.attempt.Unlock()
	if w != nil {
		w.grant()
	}
	return again, err
}

// attemptLocked is try's attempt, with p.attempt held; it returns the
// waiter to grant, if any.
func (p *Pacer) attemptLocked(q *queue, operator bool) (w *waiter, again bool, err error) {
	bkey := p.dir + strconv.Itoa(q.bucket)
	rctx, cancel := context.WithTimeout(p.ctx, readTimeout)
	r, err := p.kv.Txn(rctx).Then(clientv3.OpGet(bkey), clientv3.OpGet(p.counterKey)).Commit()
	cancel()
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", bkey, err)
	}
	if len(r.Responses[0].GetResponseRange().GetKvs()) > 0 {
		return nil, false, nil // held, by us or another node: wait for its end
	}
	c, err := p.parseCounter(r.Responses[1].GetResponseRange().GetKvs(), r.Header.Revision)
	if err != nil {
		return nil, false, err
	}
	p.mu.Lock()
	p.seeLocked(c)
	started, startedMono := p.clock.Now(), clock.Mono(p.clock)
	used, limit := p.usedLocked(c, started), p.limitLocked(operator)
	live := c.live()
	base, reset := 0, time.Time{}
	if !live && started.Before(p.floorUntil) {
		base, reset = p.floorUsed, p.floorUntil
	}
	p.mu.Unlock()
	if used+1 > limit {
		return nil, false, nil // the budget: the counter's deletion kicks us
	}
	deadline := started.Add(p.hold)
	// The hold is judged on p.clock alone, never by a real-time context:
	// a create cut off at the hold would leave its outcome unknown (a
	// start perhaps counted for nothing, and no way to give it back),
	// and with an injected clock it would fail attempts the clock allows.
	actx, cancel := context.WithTimeout(p.ctx, readTimeout)
	defer cancel()
	kl, err := p.leases.Grant(actx, p.keySecs)
	if err != nil {
		return nil, false, fmt.Errorf("grant the lease of %s: %w", bkey, err)
	}
	var cmps []clientv3.Cmp
	var put clientv3.Op
	var pl *clientv3.LeaseGrantResponse
	if live {
		reset = c.reset
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(p.counterKey), "=", c.modRev)}
		put = clientv3.OpPut(p.counterKey, encodeCounter(used+1, reset), clientv3.WithIgnoreLease())
	} else {
		used = max(used, base)
		if reset.IsZero() {
			reset = started.Add(core.DiscordStartPeriod + startMargin)
		}
		secs := int64((reset.Sub(started) + time.Second - 1) / time.Second)
		if pl, err = p.leases.Grant(actx, max(secs, 2)); err != nil {
			p.revoke(kl.ID)
			return nil, false, fmt.Errorf("grant the lease of %s: %w", p.counterKey, err)
		}
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(p.counterKey), "=", 0)}
		put = clientv3.OpPut(p.counterKey, encodeCounter(used+1, reset), clientv3.WithLease(pl.ID))
	}
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(bkey), "=", 0))
	if p.clock.Now().After(deadline) {
		// The grants were slow: a slot created now could not be handed
		// out, so spend no start on it, and try again at once (a kick,
		// not again: slowness is no race, and the next attempt may be
		// quicker).
		p.revoke(kl.ID)
		if pl != nil {
			p.revoke(pl.ID)
		}
		kick(q)
		return nil, false, nil
	}
	if p.beforeTxn != nil {
		p.beforeTxn()
	}
	tr, err := p.kv.Txn(actx).If(cmps...).Then(clientv3.OpPut(bkey, p.node, clientv3.WithLease(kl.ID)), put).Commit()
	if err != nil || !tr.Succeeded {
		// Unknown or refused: never a grant. A commit we did not hear of
		// leaves a key that expires with its lease, which we keep.
		if err == nil {
			p.revoke(kl.ID)
			if pl != nil {
				p.revoke(pl.ID)
			}
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("create %s: %w", bkey, err)
	}
	// The counter as this create wrote it, seen now rather than when the
	// watch brings it: the budget the tree shows, and BudgetWait, count
	// the slot from its grant on.
	lease := c.lease
	if pl != nil {
		lease = pl.ID
	}
	p.mu.Lock()
	p.seeLocked(counterView{present: true, used: used + 1, reset: time.UnixMilli(reset.UnixMilli()), modRev: tr.Header.Revision, lease: lease, rev: tr.Header.Revision})
	if now := p.clock.Now(); now.After(deadline) {
		p.mu.Unlock()
		p.log.Warn("identify: slot acquired after the hold, lost", "bucket", q.bucket, "took", now.Sub(started))
		// No identify goes out on it: give its start back. The bucket
		// key stays; its expiry kicks the queue.
		p.refund(reset)
		return nil, false, nil
	}
	slot := slotGrant{by: startedMono + p.identifyWithin(), reset: reset, lease: kl.ID, ends: startedMono + time.Duration(p.keySecs)*time.Second}
	if len(q.waiters) == 0 {
		q.heldUntil, q.held = deadline, slot
		p.mu.Unlock()
		return nil, false, nil
	}
	w = q.waiters[0]
	q.waiters = q.waiters[1:]
	w.q = nil
	p.slots[w.shard] = slot
	p.issueLocked(w.shard, slot)
	p.mu.Unlock()
	return w, false, nil
}

// identifyWithin is how long after its slot began an identify may go out:
// the bucket's next slot, on any node, begins no earlier than the key's
// TTL after this one (etcd never expires a lease early), so an identify
// sent within KeyTTL − 5 s keeps Discord's 5 s per bucket whatever the
// next one does. With a key TTL too short for that (tests), the hold.
func (p *Pacer) identifyWithin() time.Duration {
	return max(time.Duration(p.keySecs)*time.Second-core.DiscordWindow, p.hold)
}

var _ core.SlotDeadliner = (*Pacer)(nil)

// ReleaseMargin is how long after Discord's 5 s from an identify's write
// its bucket key is released (Written): room for the identify's own way
// to the gateway being slower than the next one's.
const ReleaseMargin = 500 * time.Millisecond

// issueLocked records the slot handed to shard, for Written; slots whose
// key's lease has run out are forgotten (their identify never came).
func (p *Pacer) issueLocked(shard int, g slotGrant) {
	now := clock.Mono(p.clock)
	for id, old := range p.issued {
		if now >= old.ends {
			delete(p.issued, id)
		}
	}
	if g.lease != clientv3.NoLease {
		p.issued[shard] = g
	}
}

// Written is gateway.Config.IdentifyWritten in a fleet: shard's identify
// was written at at (on the pacer's clock). The bucket key of its slot
// then need not live out its lease (KeyTTL from the slot's start, 7 s,
// and etcd's expiry check after it): it is released, by revoking its
// lease, Discord's 5 s plus ReleaseMargin after the write, so that the
// bucket's next slot, on any node, starts then (issue 22: a bucket gave
// one identify per 7.5 s where Discord allows one per 5 s). The argument
// is the key's: the next slot starts only once the key is gone, and its
// identify goes out after that, so two identifies of the bucket are at
// least 5 s apart, measured on this node's clock from the end of the
// first write. A node that dies before the release leaves the key to
// expire with its lease, as before; an identify that was never written
// (a lost slot) releases nothing early.
func (p *Pacer) Written(shard int, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.issued[shard]
	if !ok || p.closed {
		return
	}
	delete(p.issued, shard)
	wait := core.DiscordWindow + ReleaseMargin - p.clock.Now().Sub(at)
	if clock.Mono(p.clock)+wait >= g.ends {
		return // the lease ends first
	}
	var t clock.Timer
	t = p.clock.AfterFunc(max(wait, 0), func() {
		p.mu.Lock()
		delete(p.releases, t)
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		defer p.wg.Done()
		p.revoke(g.lease)
	})
	p.releases[t] = struct{}{}
}

// IdentifyBy implements core.SlotDeadliner: the deadline of the slot last
// granted to shard, and a func that gives its start back (one off the
// counter of its period, in the background) when the identify did not go
// out. The core asks right after the grant; the answer is handed out once.
func (p *Pacer) IdentifyBy(shard int) (time.Duration, func(), bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.slots[shard]
	if !ok {
		return 0, nil, false
	}
	delete(p.slots, shard)
	return g.by, func() { p.giveBack(g) }, true
}

// giveBack refunds the start of a slot whose identify did not go out.
func (p *Pacer) giveBack(g slotGrant) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.log.Info("identify: a slot's identify did not go out by its deadline; giving its start back")
	p.wg.Go(func() { p.refund(g.reset) })
}

// refundTries bounds the attempts of a refund; each failed one means
// another slot counted meanwhile.
const refundTries = 10

// refund takes one start off the counter of the period ending at reset,
// the start a lost slot's create counted: every later count of that
// period was written on top of it (each is guarded by the ModRevision it
// read). A period gone meanwhile has nothing to give back. One edge: a
// node whose discovery answer raised the count above the counter in the
// meantime wrote its own figure, not ours plus one, and so ends one low;
// the reserve absorbs that.
func (p *Pacer) refund(reset time.Time) {
	for range refundTries {
		ctx, cancel := context.WithTimeout(p.ctx, readTimeout)
		ok, err := p.refundOnce(ctx, reset)
		cancel()
		if err != nil {
			p.log.Warn("identify: give back the start of a lost slot: " + err.Error() + "; it stays counted")
			return
		}
		if ok {
			return
		}
	}
	p.log.Warn("identify: give back the start of a lost slot: the counter kept moving; it stays counted")
}

// refundOnce makes one attempt; ok is false when the counter moved between
// the read and the write.
func (p *Pacer) refundOnce(ctx context.Context, reset time.Time) (ok bool, err error) {
	r, err := p.kv.Get(ctx, p.counterKey)
	if err != nil {
		return false, err
	}
	c, err := p.parseCounter(r.Kvs, r.Header.Revision)
	if err != nil {
		return false, err
	}
	if !c.present || c.reset.UnixMilli() != reset.UnixMilli() || c.used == 0 {
		return true, nil
	}
	back := clientv3.OpPut(p.counterKey, encodeCounter(c.used-1, c.reset), clientv3.WithIgnoreLease())
	if c.used == 1 {
		// The lost slot started the period: it has not begun.
		back = clientv3.OpDelete(p.counterKey)
	}
	tr, err := p.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(p.counterKey), "=", c.modRev)).Then(back).Commit()
	if err != nil || !tr.Succeeded {
		return false, err
	}
	if c.used == 1 && c.lease != clientv3.NoLease {
		p.revoke(c.lease)
	}
	return true, nil
}

func (p *Pacer) revoke(id clientv3.LeaseID) {
	// A lease attached to nothing: revoking it costs nobody a gap.
	ctx, cancel := context.WithTimeout(p.ctx, readTimeout)
	defer cancel()
	p.leases.Revoke(ctx, id) // on failure it expires by itself
}

func encodeCounter(used int, reset time.Time) string {
	return fmt.Sprintf("%d %d", used, reset.UnixMilli())
}

func (p *Pacer) parseCounter(kvs []*mvccpb.KeyValue, rev int64) (counterView, error) {
	if len(kvs) == 0 {
		return counterView{rev: rev}, nil
	}
	kv := kvs[0]
	var used int
	var ms int64
	if n, err := fmt.Sscanf(string(kv.Value), "%d %d", &used, &ms); n != 2 || err != nil || used < 0 {
		// Garbage: a slot would be counted against nothing, so none is
		// handed out until an operator deletes the key.
		return counterView{}, fmt.Errorf("%s holds %q, want \"USED RESET_UNIX_MS\"; no slot until it is fixed or deleted", p.counterKey, clipValue(kv.Value))
	}
	return counterView{present: true, used: used, reset: time.UnixMilli(ms), modRev: kv.ModRevision, lease: clientv3.LeaseID(kv.Lease), rev: rev}, nil
}

func clipValue(v []byte) string {
	if len(v) > 64 {
		return string(v[:64]) + "..."
	}
	return string(v)
}

// seeLocked keeps the newest view of the counter.
func (p *Pacer) seeLocked(c counterView) {
	if c.rev >= p.counter.rev {
		p.counter = c
	}
}

// watch follows the identify keys: a deleted bucket key (expired) kicks
// its queue, a deleted or lowered counter every queue, and the counter's
// changes keep BudgetWait current.
func (p *Pacer) watch() {
	defer p.wg.Done()
	for p.ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(p.ctx))
		for resp := range p.watcher.Watch(wctx, p.dir, clientv3.WithPrefix()) {
			if err := resp.Err(); err != nil {
				if p.ctx.Err() == nil {
					p.log.Warn("identify: watch " + p.dir + ": " + err.Error() + "; polling every " + p.retry.String() + " until it is back")
				}
				break
			}
			p.mu.Lock()
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key)
				switch {
				case key == p.counterKey && ev.Type == clientv3.EventTypeDelete:
					p.seeLocked(counterView{rev: ev.Kv.ModRevision})
					p.kickAllLocked()
				case key == p.counterKey:
					if c, err := p.parseCounter([]*mvccpb.KeyValue{ev.Kv}, ev.Kv.ModRevision); err == nil {
						if c.used < p.counter.used {
							// A lost slot's start given back: a
							// request stopped by the budget may go.
							p.kickAllLocked()
						}
						p.seeLocked(c)
					}
				case ev.Type == clientv3.EventTypeDelete:
					if b, err := strconv.Atoi(strings.TrimPrefix(key, p.dir)); err == nil {
						if q := p.queues[b]; q != nil {
							kick(q)
						}
					}
				}
			}
			p.mu.Unlock()
		}
		cancel()
		p.mu.Lock()
		p.kickAllLocked() // events may have been missed
		p.mu.Unlock()
		done := make(chan struct{})
		t := p.clock.AfterFunc(p.retry, func() { close(done) })
		select {
		case <-done:
		case <-p.ctx.Done():
			t.Stop()
		}
	}
}

// held returns until when a slot of bucket b is held with no waiter (zero
// if none): for the tests.
func (p *Pacer) held(b int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := p.queues[b]; q != nil {
		return q.heldUntil
	}
	return time.Time{}
}

// Budget returns the figures of /identify as this node last saw them.
func (p *Pacer) Budget() core.Budget {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	b := core.Budget{Total: p.total, Reserve: p.reserveLocked(), MaxConcurrency: p.mc}
	b.Remaining = max(p.total-p.usedLocked(p.counter, now), 0)
	if p.counter.live() {
		b.ResetAt = p.counter.reset
	} else if now.Before(p.floorUntil) {
		b.ResetAt = p.floorUntil
	}
	for _, q := range p.queues {
		b.Waiting += len(q.waiters)
	}
	return b
}
