package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// Shards is the part of the lifecycle core the ownership layer drives
// (core.Scheduler): grants of ownership and planned handovers.
type Shards interface {
	SetLease(core.LeaseGrant)
	Handover(id int) (saved bool, err error)
}

// OwnershipConfig describes one node's ownership of a bot's shards.
type OwnershipConfig struct {
	Client *clientv3.Client
	Bot    string
	Node   string
	Plan   Plan
	// Candidates are the shards this node may own (serve's --shards);
	// nil means every shard of the plan.
	Candidates []int
	// TTL of the node's lease (--etcd-ttl); zero means DefaultTTL.
	TTL time.Duration
	// MaxConcurrency paces planned moves: at most that many per MoveWindow.
	MaxConcurrency int
	Shards         Shards
	// MayRenew is the operator's lease (Config.MayRenew).
	MayRenew func() bool
	Clock    clock.Clock  // nil = real time
	Logger   *slog.Logger // nil = slog.Default()

	// MaxConcurrencyNow, when set, is asked before each round of moves
	// for the max_concurrency in force, which Discord's discovery may
	// raise after the node started; MaxConcurrency is the figure until
	// it answers.
	MaxConcurrencyNow func() int
}

// callTimeout bounds each etcd call of the ownership loop, in real time:
// a hung etcd must not hold the loop, which also watches the deadline.
// Every call also requires a leader (clientv3.WithRequireLeader): a member
// cut off from the others then refuses at once rather than hold the call
// until it times out, and the client's next call goes to another
// endpoint (TestSoakCluster's member partition).
const callTimeout = 5 * time.Second

// acquireConcurrency bounds the acquisitions in flight: each waits for its
// transaction and then for the shard's snapshot load.
const acquireConcurrency = 32

// Ownership keeps one node's share of a bot's shards: it joins (and joins
// again after a lost membership, but only while the operator's lease,
// MayRenew, is valid: a node whose lease expired stays out, state held,
// so its shards stay with the others), watches members/ and shards/,
// computes the node's placement (Place: balanced over the live members'
// candidates, keeping held keys where they are),
// acquires its shards by create-if-absent and grants them to the core with
// the membership's fencing deadline and the key's generation, renews the
// grants as the membership renews, and hands over, by paced planned moves
// (stop 4000, snapshot saved under the generation's guard, key released
// under it), the shards a joining member should own.
//
// etcd unreachable: the node keeps trying to join, owns nothing and says
// so in Status. A plan mismatch ends Run with the error, naming both plans.
type Ownership struct {
	cfg        OwnershipConfig
	clock      clock.Clock
	log        *slog.Logger
	candidates []int
	pacer      *MovePacer
	kick       chan struct{}

	wg sync.WaitGroup // moves in flight; Add under mu, unless noMoves

	// order serializes, per shard (striped), deciding that a grant is
	// current and handing it to the core, and every stop: a renewal that
	// copied the owned set before a stop cannot hand a grant over after
	// it, so a stop always wins (issue 22 item 4). Taken before mu.
	order [64]sync.Mutex

	mu       sync.Mutex
	member   *Member
	owned    map[int]int64  // shard → generation granted to the core
	busy     map[int]bool   // a move or an acquisition is in flight
	state    OwnershipState // changed only by moveLocked
	lastErr  error
	members  []string
	holders  []Holder
	read     bool // members and holders were read from etcd at least once
	draining bool
	left     bool
	noMoves  bool          // Drain waits for wg: no move starts any more
	drained  chan struct{} // closed when draining and nothing is owned
	moves    uint64
	fenced   uint64
	joins    uint64
	logged   string // the last waiting error logged

	// fencedGen: shard → the generation it had when a lost membership
	// stopped it; its next acquisition asks etcd's history whether
	// anyone else owned it in between (soleOwner).
	fencedGen map[int]int64
	// staleLease is a lost membership's lease whose revoke failed (etcd
	// was down): revoked before the next join, so that an etcd that comes
	// back with it alive does not hold the node out for its TTL.
	staleLease clientv3.LeaseID
}

// OwnershipState is where a node's ownership is in its life, as /lease
// shows it.
type OwnershipState string

// The ownership states.
const (
	StateJoining  OwnershipState = "joining"
	StateWaiting  OwnershipState = "waiting" // etcd unreachable or the member key still held
	StateMember   OwnershipState = "member"
	StateDraining OwnershipState = "draining"
	StateLeft     OwnershipState = "left"
	StateRefused  OwnershipState = "refused" // plan mismatch or bad names
	// StateHeld: the operator's lease (MayRenew) is not valid, so the
	// node stays out of the bot and owns nothing until it is again.
	StateHeld OwnershipState = "held"
)

// ownershipStates lists every state, in the order of a node's life.
var ownershipStates = []OwnershipState{StateJoining, StateWaiting, StateHeld, StateMember, StateDraining, StateRefused, StateLeft}

// ownershipMoves lists, for each state, the states the ownership may move
// to: its whole life in one place. Staying in a state is no move (a join
// that fails again only changes the error). Every state but left may be
// left for left: Drain ends there whatever the node was doing.
var ownershipMoves = map[OwnershipState][]OwnershipState{
	// Run's first join: it succeeds, fails (waiting), is refused, or the
	// operator's lease holds the node out first.
	StateJoining: {StateWaiting, StateHeld, StateMember, StateRefused, StateLeft},
	StateWaiting: {StateHeld, StateMember, StateRefused, StateLeft},
	StateHeld:    {StateWaiting, StateMember, StateRefused, StateLeft},
	// To joining: the membership's lease was lost. To waiting, held,
	// member or refused: the membership was closed, and Run joins again.
	StateMember: {StateJoining, StateWaiting, StateHeld, StateDraining, StateRefused, StateLeft},
	// A drain that began while Run was between memberships (the last one
	// closed) does not stop Run's next write: waiting, held or refused.
	// It never becomes a member again (join refuses while draining).
	StateDraining: {StateJoining, StateWaiting, StateHeld, StateRefused, StateLeft},
	StateRefused:  {StateLeft},
	StateLeft:     nil,
}

// moveLocked moves the ownership to state to, with err as its /lease
// error, and reports whether it did; staying in a state only sets the
// error. Once Drain has begun to leave (o.left), only left may follow: a
// write of Run's that races the drain's end is dropped. Any other move
// ownershipMoves does not list is a bug in the caller and panics, as a
// gateway connection's phase does.
func (o *Ownership) moveLocked(to OwnershipState, err error) bool {
	if o.left && to != StateLeft {
		return false
	}
	if from := o.state; from != to && !slices.Contains(ownershipMoves[from], to) {
		panic(fmt.Sprintf("etcd: ownership state %s cannot move to %s", from, to))
	}
	o.state, o.lastErr = to, err
	return true
}

// ErrOperatorLease is the /lease error of StateHeld.
var ErrOperatorLease = errors.New("etcd: the operator's lease has expired: this node stays out of the bot (owns nothing) until it is renewed")

// heldPoll is how often a held node asks MayRenew again.
const heldPoll = time.Second

// NewOwnership returns the ownership of cfg; Run runs it.
func NewOwnership(cfg OwnershipConfig) (*Ownership, error) {
	if cfg.Client == nil || cfg.Shards == nil {
		return nil, errors.New("etcd: ownership needs a client and the shards")
	}
	if err := checkMember(cfg.Bot, cfg.Node, cfg.Plan); err != nil {
		return nil, err
	}
	o := &Ownership{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Logger, kick: make(chan struct{}, 1),
		owned: map[int]int64{}, fencedGen: map[int]int64{}, busy: map[int]bool{}, state: StateJoining, drained: make(chan struct{})}
	if o.log == nil {
		o.log = slog.Default()
	}
	if cfg.TTL == 0 {
		o.cfg.TTL = DefaultTTL
	}
	o.pacer = NewMovePacer(o.clock, cfg.MaxConcurrency)
	if cfg.Candidates == nil {
		for id := 0; id < cfg.Plan.Total; id++ {
			o.candidates = append(o.candidates, id)
		}
	} else {
		for _, id := range cfg.Candidates {
			if id < 0 || id >= cfg.Plan.Total {
				return nil, fmt.Errorf("%w: candidate shard %d, plan %s", ErrUnknownShard, id, cfg.Plan)
			}
		}
		o.candidates = slices.Sorted(slices.Values(cfg.Candidates))
	}
	return o, nil
}

// Prefix is the folder of the bot's keys (for sessions/etcd's Guard).
func (o *Ownership) Prefix() string { return Prefix(o.cfg.Bot) }

// Guarded forwards to the current membership (for sessions/etcd's Guard):
// a node that joined again writes through its new Member.
func (o *Ownership) Guarded(ctx context.Context, shard int, gen int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	o.mu.Lock()
	m := o.member
	o.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("etcd: guarded write of shard %d: node %s is not a member now: %w", shard, o.cfg.Node, ErrLeaseLost)
	}
	return m.Guarded(ctx, shard, gen, ops...)
}

// Generation returns the generation this node holds for shard (for
// sessions/etcd's Generation).
func (o *Ownership) Generation(shard int) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	gen, ok := o.owned[shard]
	return gen, ok
}

func (o *Ownership) ownedNow() map[int]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.owned)
}

func (o *Ownership) wake() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// Run joins and keeps the node's shards until ctx ends. It returns nil
// then, or the error that refuses the node (plan mismatch, bad plan key).
// When it returns, the membership is closed (its lease revoked) and every
// shard it owned has been stopped by its grant.
func (o *Ownership) Run(ctx context.Context) error {
	delay := time.Second
	for {
		if o.leaving() {
			// Drained (or draining with its membership gone): never join
			// again, or the others would hand this node shards.
			<-ctx.Done()
			return nil
		}
		if !o.mayJoin(ctx) {
			return nil
		}
		m, err := o.join(ctx)
		if ctx.Err() != nil {
			if m != nil {
				o.endMembership(m, "shutdown")
			}
			return nil
		}
		switch {
		case errors.Is(err, errLeaving):
			continue
		case errors.Is(err, ErrPlanMismatch), errors.Is(err, ErrBadPlan), errors.Is(err, ErrBadName), errors.Is(err, ErrEtcdTooOld):
			o.setState(StateRefused, err)
			o.log.Error("etcd: this node cannot join the bot", "err", err)
			return err
		case err != nil:
			o.setState(StateWaiting, err)
			o.mu.Lock()
			if o.staleLease != 0 {
				// A lost membership's keys may still live in etcd (one that
				// comes back with its leases, or a cluster between two
				// leaders): rejoin within their TTL, so that Join keeps
				// them (Config.Replaces) before they expire and the other
				// nodes take the shards.
				delay = min(delay, max(o.cfg.TTL/10, 100*time.Millisecond))
			}
			o.mu.Unlock()
			if msg := err.Error(); msg != o.logged {
				o.logged = msg
				o.log.Warn("etcd: cannot join yet; owning nothing, retrying", "node", o.cfg.Node, "err", err, "retry", delay)
			}
			if !o.sleep(ctx, delay) {
				return nil
			}
			delay = min(2*delay, 10*time.Second)
			continue
		}
		delay, o.logged = time.Second, ""
		o.serve(ctx, m)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// mayJoin waits while the operator's lease is not valid (MayRenew false):
// a node whose health script stopped renewing must stay out, not join
// again, take its share back by planned moves and lose it at
// the next deadline, every TTL. One line is logged when it starts waiting
// and one when it may join again. False when ctx ended.
func (o *Ownership) mayJoin(ctx context.Context) bool {
	if o.cfg.MayRenew == nil || o.cfg.MayRenew() {
		return true
	}
	o.setState(StateHeld, ErrOperatorLease)
	o.log.Warn("etcd: the operator's lease has expired; staying out of the bot until it is renewed", "node", o.cfg.Node)
	for !o.cfg.MayRenew() {
		if o.leaving() {
			return true // Run stays out
		}
		if !o.sleep(ctx, heldPoll) {
			return false
		}
	}
	o.log.Info("etcd: the operator's lease is valid again; joining", "node", o.cfg.Node)
	return true
}

// sleep waits d on the clock, or until ctx ends (false).
func (o *Ownership) sleep(ctx context.Context, d time.Duration) bool {
	ch := make(chan struct{})
	t := o.clock.AfterFunc(d, func() { close(ch) })
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-ch:
		return true
	}
}

func (o *Ownership) join(ctx context.Context) (*Member, error) {
	o.mu.Lock()
	stale := o.staleLease
	o.mu.Unlock()
	timeout := callTimeout
	if stale != 0 {
		// The lost membership's keys live in etcd until its lease expires,
		// as little as a second after this node's deadline: a join that
		// hangs (its write sent to a member whose leader was just killed)
		// is given up after TTL/3 (2 s at least) and tried again, on another endpoint,
		// rather than after 5 s, when the others have taken the shards.
		timeout = min(callTimeout, max(cmp.Or(o.cfg.TTL, DefaultTTL)/3, 2*time.Second))
	}
	jctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), timeout)
	defer cancel()
	o.mu.Lock()
	// The etcd version was checked at the first join: a join again after
	// a lost membership, with a member down, must not wait for it.
	checked := o.joins > 0
	o.mu.Unlock()
	m, err := Join(jctx, Config{
		Client: o.cfg.Client, Bot: o.cfg.Bot, Node: o.cfg.Node, Plan: o.cfg.Plan, Candidates: o.cfg.Candidates, TTL: o.cfg.TTL,
		Clock: o.clock, Logger: o.log, MayRenew: o.cfg.MayRenew, Replaces: stale, versionChecked: checked,
	})
	if err != nil {
		return nil, err
	}
	if stale != 0 {
		o.mu.Lock()
		o.staleLease = 0
		o.mu.Unlock()
	}
	o.mu.Lock()
	if o.draining || o.left {
		// A drain began while Join was on its way: a member key now would
		// draw shards to a node that is leaving.
		o.mu.Unlock()
		o.endMembership(m, "left")
		return nil, errLeaving
	}
	o.member = m
	o.joins++
	o.moveLocked(StateMember, nil)
	o.mu.Unlock()
	return m, nil
}

// serve keeps the shards of one membership until it ends, ctx ends, or
// the node has drained and left.
func (o *Ownership) serve(ctx context.Context, m *Member) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := func(dir string) clientv3.WatchChan {
		if wctx.Err() != nil {
			return nil // ending: a nil channel is never ready
		}
		return o.cfg.Client.Watch(clientv3.WithRequireLeader(wctx), m.Prefix()+dir, clientv3.WithPrefix())
	}
	mw, sw := watch("members/"), watch("shards/")
	// Grants follow renewals on their own goroutine: a reconcile that
	// reads 16,384 keys must not hold them back past their deadline.
	var renewals sync.WaitGroup
	renewals.Go(func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-m.Done():
				return
			case <-m.Renewed():
				o.renewGrants(m)
			}
		}
	})
	defer renewals.Wait()
	defer cancel()
	// A resync now and then retries what failed and covers a watch that
	// fell behind.
	resyncEvery := max(m.TTL()/2, time.Second)
	resync := o.clock.AfterFunc(resyncEvery, o.wake)
	defer resync.Stop()
	// A reconcile's calls end with the membership: a read held by a
	// member cut off from the others (up to callTimeout) must not keep
	// this loop from ending the lost membership and joining again while
	// the old lease's keys still live.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	defer context.AfterFunc(m.callCtx, rcancel)()
	o.reconcile(rctx, m)
	for {
		select {
		case <-ctx.Done():
			o.wg.Wait()
			o.endMembership(m, "shutdown")
			return
		case <-m.Done():
			o.wg.Wait()
			why := "lease lost"
			if errors.Is(m.Err(), ErrClosed) {
				why = "closed"
			}
			o.endMembership(m, why)
			return
		case _, ok := <-mw:
			if !ok {
				mw = watch("members/")
			}
		case _, ok := <-sw:
			if !ok {
				sw = watch("shards/")
			}
		case <-o.kick:
		}
		// One reconcile for every event already queued: a burst of key
		// changes (a node acquiring thousands of shards) costs one read.
		for drained := false; !drained; {
			select {
			case _, ok := <-mw:
				if !ok {
					mw = watch("members/")
				}
			case _, ok := <-sw:
				if !ok {
					sw = watch("shards/")
				}
			case <-o.kick:
			default:
				drained = true
			}
		}
		resync.Reset(resyncEvery)
		if o.leaveIfDrained(m) {
			return
		}
		o.reconcile(rctx, m)
	}
}

// grant is the core's grant for a shard held at gen under m.
func grant(id int, gen int64, m *Member) core.LeaseGrant {
	return core.LeaseGrant{Shard: id, Owner: true, Generation: uint64(gen), Deadline: m.Deadline()}
}

// renewGrants moves every owned shard's deadline to the membership's.
// Each grant is checked again as it is handed over: the shard may have
// been stopped since the owned set was copied.
func (o *Ownership) renewGrants(m *Member) {
	o.mu.Lock()
	type held struct {
		id  int
		gen int64
	}
	grants := make([]held, 0, len(o.owned))
	for id, gen := range o.owned {
		if !o.busy[id] {
			grants = append(grants, held{id, gen})
		}
	}
	o.mu.Unlock()
	for _, g := range grants {
		o.sendGrant(grant(g.id, g.gen, m), true)
	}
}

// sendGrant hands the core grant g, unless the
// shard is no longer owned at gen (it was stopped or moved meanwhile) or,
// for a renewal, a move of it began.
func (o *Ownership) sendGrant(g core.LeaseGrant, renewal bool) bool {
	id, gen := g.Shard, int64(g.Generation)
	l := &o.order[id%len(o.order)]
	l.Lock()
	defer l.Unlock()
	o.mu.Lock()
	cur, ok := o.owned[id]
	stale := !ok || cur != gen || (renewal && o.busy[id])
	o.mu.Unlock()
	if stale {
		return false
	}
	o.cfg.Shards.SetLease(g)
	return true
}

// sendStop hands the core a stop (or NotOwned) after any grant of the
// shard already on its way.
func (o *Ownership) sendStop(g core.LeaseGrant) {
	l := &o.order[g.Shard%len(o.order)]
	l.Lock()
	defer l.Unlock()
	o.cfg.Shards.SetLease(g)
}

// endMembership stops every owned shard at once (each was gated by the
// deadline already; etcd may have expired the lease before it) and closes
// the membership, revoking its lease.
func (o *Ownership) endMembership(m *Member, why string) {
	o.mu.Lock()
	owned := o.owned
	o.owned = map[int]int64{}
	if o.member == m {
		o.member = nil
	}
	if why == "lease lost" {
		o.fenced += uint64(len(owned))
		o.moveLocked(StateJoining, m.Err())
		for id, gen := range owned {
			o.fencedGen[id] = gen
		}
	}
	o.mu.Unlock()
	now := o.clock.Now()
	for id, gen := range owned {
		o.sendStop(core.LeaseGrant{Shard: id, Owner: true, Generation: uint64(gen), Deadline: now})
	}
	if len(owned) > 0 {
		o.log.Warn("etcd: membership ended; its shards stopped", "node", o.cfg.Node, "why", why, "shards", len(owned))
	}
	if why == "lease lost" && (o.cfg.MayRenew == nil || o.cfg.MayRenew()) {
		// Not revoked: if etcd still holds the keys, the next Join keeps
		// them (Config.Replaces); revoked now, the others would take the
		// shards before this node is back. A node the operator's lease
		// holds out revokes, so that its shards go to the others at once.
		m.Abandon()
		o.mu.Lock()
		o.staleLease = m.LeaseID()
		o.mu.Unlock()
	} else if err := m.Close(); err != nil {
		o.log.Warn("etcd: closing the membership", "err", err)
		o.mu.Lock()
		o.staleLease = m.LeaseID()
		o.mu.Unlock()
	}
	o.checkDrained() // a drain whose membership ended has nothing left to hand over
}

// reconcile reads members and shard keys at one revision and acts: stop
// shards whose key is no longer this node's, acquire the placement's
// free shards, and move away, paced, those placed elsewhere.
func (o *Ownership) reconcile(ctx context.Context, m *Member) {
	rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), callTimeout)
	members, kvs, err := m.read(rctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("etcd: reading members and shards failed; retrying", "node", o.cfg.Node, "err", err)
		}
		return
	}
	holders := m.holders(names(members), kvs)
	held := make(map[int]Holder, len(holders))
	heldBy := make([]string, o.cfg.Plan.Total)
	for _, h := range holders {
		held[h.Shard] = h
		if h.Live {
			heldBy[h.Shard] = h.Node
		}
	}
	place := Place(members, o.cfg.Plan.Total, heldBy)
	o.mu.Lock()
	o.members, o.holders, o.read = names(members), holders, true
	draining := o.draining
	// Shards whose key this node no longer holds (deleted by hand, or
	// etcd expired the lease first): stop them now.
	var lost []core.LeaseGrant
	for id, gen := range o.owned {
		if o.busy[id] {
			continue
		}
		if h, ok := held[id]; !ok || h.Generation != gen || h.lease != m.LeaseID() {
			delete(o.owned, id)
			o.fenced++
			lost = append(lost, core.LeaseGrant{Shard: id, Owner: true, Generation: uint64(gen), Deadline: o.clock.Now()})
		}
	}
	var acquire, move []int
	for _, id := range o.candidates {
		mine := !draining && place[id] == m.Node()
		_, owned := o.owned[id]
		switch {
		case o.busy[id]:
		case mine && !owned:
			if h, ok := held[id]; !ok || h.lease == m.LeaseID() {
				acquire = append(acquire, id)
			}
		case !mine && owned:
			move = append(move, id)
		}
	}
	for _, id := range acquire {
		o.busy[id] = true
	}
	o.mu.Unlock()
	for _, g := range lost {
		o.log.Warn("etcd: shard key no longer this node's; stopping the shard", "node", o.cfg.Node, "shard", g.Shard, "generation", g.Generation)
		o.sendStop(g)
	}
	o.acquireAll(ctx, m, acquire)
	if len(move) > 0 && o.cfg.MaxConcurrencyNow != nil {
		o.pacer.SetMax(o.cfg.MaxConcurrencyNow())
	}
	// A drain's moves are not paced (DESIGN 7.3, issue 22 item 9): each
	// shard is stopped with its snapshot saved, and whoever starts it
	// next (another member, or this node restarted) resumes it, which
	// spends no identify; should a resume fail, the new owner's identify
	// waits for its slot of the identify pacer like any other. Paced, a
	// node with 40 shards at max_concurrency 1 took 200 s to stop, past
	// systemd's 90 s, after which the rest were killed and re-identified.
	// A join's moves stay paced: the shards run meanwhile, and a join
	// is no storm of resumes.
	for _, id := range move {
		if !draining {
			ok, wait := o.pacer.Take()
			if !ok {
				o.clock.AfterFunc(wait, o.wake)
				break
			}
		}
		o.mu.Lock()
		if o.noMoves {
			o.mu.Unlock()
			break
		}
		gen := o.owned[id]
		o.busy[id] = true
		o.wg.Add(1)
		o.mu.Unlock()
		go func() {
			defer o.wg.Done()
			o.move(ctx, m, id, gen)
		}()
	}
	o.checkDrained()
}

// acquireAll acquires shards, at most acquireConcurrency at a time, and
// grants each to the core as its key is created.
func (o *Ownership) acquireAll(ctx context.Context, m *Member, ids []int) {
	if len(ids) == 0 {
		return
	}
	sem := make(chan struct{}, acquireConcurrency)
	var wg sync.WaitGroup
	var acquired atomic.Int64
	defer func() {
		if n := acquired.Load(); n > 0 {
			o.log.Info("etcd: acquired shards", "node", o.cfg.Node, "count", n, "owned", len(o.ownedNow()))
		}
	}()
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), callTimeout)
			gen, err := m.Acquire(actx, id)
			cancel()
			if err != nil {
				o.mu.Lock()
				delete(o.busy, id)
				o.mu.Unlock()
				if !errors.Is(err, ErrShardTaken) {
					o.log.Warn("etcd: acquire failed; retrying at the next resync", "node", o.cfg.Node, "shard", id, "err", err)
				}
				return
			}
			o.mu.Lock()
			o.owned[id] = gen
			prev, wasFenced := o.fencedGen[id]
			delete(o.fencedGen, id)
			o.mu.Unlock()
			g := grant(id, gen, m)
			// gen == prev: Join kept the key (Config.Replaces), and the
			// core keeps the session of a generation it holds.
			if wasFenced && gen != prev {
				g.Continues = o.soleOwner(ctx, m, id, prev, gen)
			}
			// The generation is recorded first: the snapshot's mark-used
			// that SetLease may make is guarded by it.
			o.sendGrant(g, false)
			o.mu.Lock()
			delete(o.busy, id)
			o.mu.Unlock()
			o.log.Debug("etcd: acquired shard", "node", o.cfg.Node, "shard", id, "generation", gen)
			acquired.Add(1)
		}()
	}
	wg.Wait()
}

// move hands one shard over: stop with 4000 and save the snapshot (the
// save guarded by gen), then release the key under the same guard. A
// release that fails is retried at a later reconcile; the shard stays
// stopped meanwhile.
func (o *Ownership) move(ctx context.Context, m *Member, id int, gen int64) {
	start := o.clock.Now()
	saved, err := o.cfg.Shards.Handover(id)
	if err != nil {
		o.log.Warn("etcd: handover", "shard", id, "err", err)
	}
	rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), callTimeout)
	err = m.Release(rctx, id, gen)
	cancel()
	o.mu.Lock()
	delete(o.busy, id)
	if err != nil && !errors.Is(err, ErrGeneration) {
		o.mu.Unlock()
		o.log.Warn("etcd: release after handover failed; retrying", "shard", id, "generation", gen, "err", err)
		o.wake()
		return
	}
	delete(o.owned, id)
	o.moves++
	o.mu.Unlock()
	o.sendStop(core.NotOwned(id))
	o.log.Info("etcd: moved shard", "node", o.cfg.Node, "shard", id, "generation", gen, "snapshot_saved", saved, "took", o.clock.Now().Sub(start))
	o.checkDrained()
	o.wake()
}

// Drain hands every owned shard over by planned moves, not paced, then leaves
// the bot: members/<node> is deleted first, so the others place the
// shards without this node, and the lease is revoked at the end. The node
// acquires nothing afterwards. Drain returns when every shard is handed
// over, or ctx ends first (the lease is then revoked anyway, and etcd
// deletes the remaining keys: their shards start new sessions elsewhere).
func (o *Ownership) Drain(ctx context.Context) error { return o.Withdraw(ctx, nil) }

// Withdraw is Drain for a reason, which /lease shows as the error of
// state left (when the drain itself did not fail): a node whose token
// the gateway refused hands its keys back this way, so that a node with
// a working token can take the shards.
func (o *Ownership) Withdraw(ctx context.Context, why error) error {
	o.mu.Lock()
	if o.left {
		o.mu.Unlock()
		return nil
	}
	o.draining = true
	if o.state == StateMember {
		o.moveLocked(StateDraining, cmp.Or(why, o.lastErr))
	}
	m := o.member
	o.mu.Unlock()
	o.log.Info("etcd: draining: handing every shard over, then leaving", "node", o.cfg.Node)
	if m != nil {
		lctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), callTimeout)
		if err := m.Leave(lctx); err != nil {
			o.log.Warn("etcd: drain: deleting the member key failed; the others place shards without this node only once it expires", "err", err)
		}
		cancel()
	}
	o.checkDrained()
	o.wake()
	var err error
	select {
	case <-o.drained:
	case <-ctx.Done():
		err = fmt.Errorf("etcd: drain of node %s: %w", o.cfg.Node, ctx.Err())
	}
	o.mu.Lock()
	o.noMoves = true
	o.mu.Unlock()
	o.wg.Wait()
	o.mu.Lock()
	o.left = true
	m = o.member
	o.mu.Unlock()
	if m != nil {
		o.endMembership(m, "left")
	}
	if err == nil {
		o.setState(StateLeft, why)
	} else {
		o.setState(StateLeft, err)
	}
	o.log.Info("etcd: drained and left", "node", o.cfg.Node)
	return err
}

func (o *Ownership) checkDrained() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.draining || len(o.owned) > 0 || len(o.busy) > 0 {
		return
	}
	select {
	case <-o.drained:
	default:
		close(o.drained)
	}
}

// leaveIfDrained reports whether serve should return: the node left.
func (o *Ownership) leaveIfDrained(m *Member) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.left
}

// leaving reports whether the node drains or has drained and left, with
// no membership: it must not join again.
func (o *Ownership) leaving() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.left || o.draining && o.member == nil
}

// errLeaving is join's answer when a drain began during the Join.
var errLeaving = errors.New("etcd: the node is leaving")

func (o *Ownership) setState(st OwnershipState, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.moveLocked(st, err)
}

// Status is the ownership as /lease shows it.
type Status struct {
	Node  string
	State OwnershipState
	TTL   time.Duration
	// Deadline is the fencing deadline; zero when not a member.
	Deadline  time.Time
	Remaining time.Duration
	Owned     int
	Moves     uint64
	// FencingStops counts shards stopped because the membership ended or
	// their key was lost while they ran.
	FencingStops uint64
	RenewLatency time.Duration
	Joins        uint64
	Err          error
}

// Status returns the current status.
func (o *Ownership) Status() Status {
	o.mu.Lock()
	st := Status{Node: o.cfg.Node, State: o.state, TTL: o.cfg.TTL, Owned: len(o.owned), Moves: o.moves, FencingStops: o.fenced, Joins: o.joins, Err: o.lastErr}
	m := o.member
	o.mu.Unlock()
	if m != nil {
		st.TTL, st.Deadline, st.Remaining, st.RenewLatency = m.TTL(), m.Deadline(), m.Remaining(), m.RenewLatency()
		if m.Err() != nil {
			st.Deadline = time.Time{}
		}
	}
	return st
}

// LeaseText is /lease under --etcd: key value lines.
func (o *Ownership) LeaseText(now time.Time) []byte {
	st := o.Status()
	var b strings.Builder
	fmt.Fprintf(&b, "backend etcd\nnode %s\nstate %s\nttl %s\n", st.Node, st.State, st.TTL)
	if st.Deadline.IsZero() {
		b.WriteString("deadline none\nremaining none\n")
	} else {
		fmt.Fprintf(&b, "deadline %s\nremaining %s\n", st.Deadline.UTC().Format(time.RFC3339Nano), st.Remaining.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "owned %d\nmoves %d\nfencing_stops %d\njoins %d\nrenew_latency_ms %d\n", st.Owned, st.Moves, st.FencingStops, st.Joins, st.RenewLatency.Milliseconds())
	if st.Err != nil {
		fmt.Fprintf(&b, "error %s\n", strings.ReplaceAll(st.Err.Error(), "\n", " "))
	} else {
		b.WriteString("error none\n")
	}
	return []byte(b.String())
}

// MembersText is /members: one line per live member, "node shards", the
// shards being the shard keys that name it, sorted by node; as of the
// last read of etcd. Before the first read, and once the node has left
// (it reads etcd no more), it is the one line "unknown": an empty file
// would say that no node is a member, an old one what no longer holds.
func (o *Ownership) MembersText() []byte {
	o.mu.Lock()
	members, holders, read := o.members, o.holders, o.read && !o.left
	o.mu.Unlock()
	if !read {
		return []byte("unknown\n")
	}
	count := map[string]int{}
	for _, h := range holders {
		count[h.Node]++
	}
	var b strings.Builder
	for _, n := range members {
		fmt.Fprintf(&b, "%s %d\n", n, count[n])
	}
	return []byte(b.String())
}

// OwnersText is /owners: one line per shard of the plan, "id node
// generation", "-" for both when no key holds the shard; as of the last
// read of etcd. Before the first read, and once the node has left, both
// are "unknown": "- -" would say that nobody owns the shard.
func (o *Ownership) OwnersText() []byte {
	o.mu.Lock()
	holders, read := o.holders, o.read && !o.left
	o.mu.Unlock()
	b := make([]byte, 0, o.cfg.Plan.Total*16)
	if !read {
		for id := 0; id < o.cfg.Plan.Total; id++ {
			b = strconv.AppendInt(b, int64(id), 10)
			b = append(b, " unknown unknown\n"...)
		}
		return b
	}
	j := 0
	for id := 0; id < o.cfg.Plan.Total; id++ {
		b = strconv.AppendInt(b, int64(id), 10)
		for j < len(holders) && holders[j].Shard < id {
			j++
		}
		if j < len(holders) && holders[j].Shard == id {
			b = append(b, ' ')
			b = append(b, holders[j].Node...)
			b = append(b, ' ')
			b = strconv.AppendInt(b, holders[j].Generation, 10)
			b = append(b, '\n')
		} else {
			b = append(b, " - -\n"...)
		}
	}
	return b
}

// soleOwner reports whether etcd's history of shards/<id> proves that no
// other node owned the shard between prev, the generation this node held
// when a lost membership stopped it, and gen, the one it has just
// created: every event on the key at a revision in (prev, gen) must be a
// delete (the old key expiring or revoked), never a put, since a node
// owns a shard only by creating its key. The history is read by a watch
// from prev+1 up to this node's own create at gen. A compacted history,
// an error or a timeout proves nothing: the shard then loads its snapshot
// as after any new generation.
func (o *Ownership) soleOwner(ctx context.Context, m *Member, id int, prev, gen int64) bool {
	wctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	key := m.ShardKey(id)
	for resp := range o.cfg.Client.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(prev+1)) {
		if resp.CompactRevision != 0 {
			o.log.Info("etcd: the shard key's history is compacted; its session is not kept", "node", o.cfg.Node, "shard", id, "compacted", resp.CompactRevision, "generation", prev)
			return false
		}
		if err := resp.Err(); err != nil {
			break
		}
		for _, ev := range resp.Events {
			switch {
			case ev.Kv.ModRevision >= gen:
				return true
			case ev.Type == mvccpb.PUT:
				o.log.Info("etcd: another owner held the shard since this node lost it; its session is not kept", "node", o.cfg.Node, "shard", id, "owner", clip(ev.Kv.Value), "generation", ev.Kv.CreateRevision)
				return false
			}
		}
	}
	o.log.Warn("etcd: reading the shard key's history failed; its session is not kept", "node", o.cfg.Node, "shard", id, "err", wctx.Err())
	return false
}
