package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/clock"
)

// DefaultTTL is the lease TTL when Config.TTL is zero (--etcd-ttl).
const DefaultTTL = 10 * time.Second

// fenceMargin is taken off the granted TTL: etcd's own clock starts the TTL
// after our send time, and the margin covers the two clocks running at
// slightly different rates, so the node stops before the key can expire.
const fenceMargin = time.Second

// Config describes one node of one bot.
type Config struct {
	Client *clientv3.Client
	Bot    string
	Node   string
	Plan   Plan
	// Candidates are the shards this node may own, published in its
	// member key for the others' placement; nil means every shard.
	Candidates []int
	// TTL of the node's lease, in whole seconds (rounded up), at least 2 s;
	// zero means DefaultTTL.
	TTL    time.Duration
	Clock  clock.Clock  // nil = real time
	Logger *slog.Logger // nil = slog.Default()
	// MayRenew, when set, is asked before every renewal; false skips it
	// (retried every TTL/10), so the membership runs out at its deadline
	// unless MayRenew turns true again. The operator's lease composes
	// through it (DESIGN 7.3): a node renews only while it is valid.
	MayRenew func() bool

	// versionOf, when set, answers for an endpoint's etcd version
	// instead of its Status (tests).
	versionOf func(ctx context.Context, endpoint string) (string, error)
	// versionChecked skips the version check: the Ownership's joins
	// after its first, which must not wait on a member that is down.
	versionChecked bool

	// Replaces is the lease of this node's lost membership, when its
	// revoke failed (etcd was down): Join moves the member key and this
	// node's shard keys still attached to it onto the new lease, then
	// revokes it. A Put keeps a key's CreateRevision, so those shards keep
	// their generation and the core its session: the keys never ceased to
	// exist, so nobody else can have owned the shards meanwhile.
	Replaces clientv3.LeaseID
}

// Member is one node's membership of a bot: one etcd lease, the
// members/<node> key attached to it, and the renewal loop that keeps the
// self-fencing deadline. A lost membership never comes back: the caller
// stops its shards, closes it and joins again, and the shards it acquires
// then get new generations.
type Member struct {
	bot, node  string
	plan       Plan
	candidates []int
	prefix     string
	kv         clientv3.KV
	lease      clientv3.Lease
	clock      clock.Clock
	log        *slog.Logger
	id         clientv3.LeaseID
	ttl        time.Duration // as granted
	// hedge is the wait after which a renewal not answered yet is sent
	// again (to the next endpoint) while the first try goes on; zero
	// with one endpoint.
	hedge time.Duration

	kick       chan struct{} // the renewal timer asks the loop for a renewal
	stop       chan struct{}
	stopOnce   sync.Once
	closeErr   error
	loopDone   chan struct{}
	done       chan struct{} // closed when the membership ends
	callCtx    context.Context
	callCancel context.CancelFunc // at loss or Close: ends a renewal in flight
	afterRenew func(error)        // test hook, called by the loop after each attempt
	mayRenew   func() bool
	renewed    chan struct{} // signalled after each successful renewal
	left       atomic.Bool   // Leave deleted members/<node> (Confirm)

	mu       sync.Mutex
	deadline time.Duration // monotonic, see clock.Mono
	err      error         // why the membership ended; nil while it lasts
	renewT   clock.Timer
	lossT    clock.Timer
	renewals int
	rtt      time.Duration    // of the last answered renewal
	wallAt   time.Time        // wall reading (no monotonic part) at monoAt
	monoAt   time.Duration    // for noticing a step of the wall clock
	logged   map[string]int64 // malformed keys already logged, by key: mod revision
}

// Join checks or writes the plan, grants the node's lease and creates
// members/<node> attached to it. It fails with ErrPlanMismatch (naming both
// plans), ErrBadPlan, or ErrMemberExists when another lease holds the
// member key: another process with this node name, or a previous run of
// this node whose lease has not expired yet (it does within the TTL).
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Client == nil {
		return nil, errors.New("etcd: Join: no client")
	}
	if err := checkMember(cfg.Bot, cfg.Node, cfg.Plan); err != nil {
		return nil, err
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs < 2 {
		return nil, fmt.Errorf("etcd: TTL %v below the minimum of 2s", cfg.TTL)
	}
	m := &Member{
		bot: cfg.Bot, node: cfg.Node, plan: cfg.Plan, candidates: cfg.Candidates, prefix: Prefix(cfg.Bot),
		kv: RequireLeader(cfg.Client), lease: cfg.Client, clock: clock.Or(cfg.Clock), log: cfg.Logger,
		mayRenew: cfg.MayRenew, renewed: make(chan struct{}, 1),
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	status := cfg.versionOf
	if status == nil {
		status = func(ctx context.Context, ep string) (string, error) {
			r, err := cfg.Client.Status(ctx, ep)
			if err != nil {
				return "", err
			}
			return r.Version, nil
		}
	}
	if !cfg.versionChecked {
		if err := checkVersion(ctx, status, cfg.Client.Endpoints()); err != nil {
			return nil, err
		}
	}
	if err := m.ensurePlan(ctx); err != nil {
		return nil, err
	}
	sent := clock.Mono(m.clock)
	g, err := m.lease.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("etcd: grant lease of %ds: %w", secs, err)
	}
	key := m.prefix + "members/" + m.node
	var r *clientv3.TxnResponse
	if cfg.Replaces != 0 {
		r, err = m.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", cfg.Replaces)).
			Then(clientv3.OpPut(key, encodeMember(m.node, m.candidates), clientv3.WithLease(g.ID))).Commit()
	}
	if err == nil && (r == nil || !r.Succeeded) {
		r, err = m.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, encodeMember(m.node, m.candidates), clientv3.WithLease(g.ID))).
			Else(clientv3.OpGet(key)).Commit()
	}
	if err == nil && !r.Succeeded {
		err = fmt.Errorf("%w: %s", ErrMemberExists, describeHolder(r, key))
	}
	if err != nil {
		m.revoke(g.ID)
		return nil, fmt.Errorf("etcd: join bot %s as node %s: %w", m.bot, m.node, err)
	}
	if len(cfg.Client.Endpoints()) > 1 {
		m.hedge = hedgeAfter(time.Duration(g.TTL) * time.Second)
	}
	m.start(g.ID, time.Duration(g.TTL)*time.Second, sent, nil)
	if cfg.Replaces != 0 {
		n := m.adopt(ctx, cfg.Replaces)
		if err := m.revoke(cfg.Replaces); err != nil {
			m.log.Warn("etcd: revoking the lost membership's lease", "err", err)
		}
		m.log.Info("etcd: shard keys of the lost membership kept", "node", m.node, "shards", n)
	}
	m.log.Info("etcd: joined", "bot", m.bot, "node", m.node, "lease", fmt.Sprintf("%x", int64(g.ID)), "ttl", m.ttl)
	return m, nil
}

// adoptBatch bounds the keys moved in one transaction (etcd's default
// --max-txn-ops is 128).
const adoptBatch = 32

// adopt moves this node's shard keys still attached to old onto the
// membership's lease, each guarded by its lease, and returns how many
// moved. A batch that fails moves nothing; its keys go with old's revoke.
func (m *Member) adopt(ctx context.Context, old clientv3.LeaseID) int {
	r, err := m.kv.Get(ctx, m.prefix+"shards/", clientv3.WithPrefix())
	if err != nil {
		return 0
	}
	var keys []string
	for _, kv := range r.Kvs {
		if clientv3.LeaseID(kv.Lease) == old && string(kv.Value) == m.node {
			keys = append(keys, string(kv.Key))
		}
	}
	moved := 0
	for len(keys) > 0 {
		batch := keys[:min(adoptBatch, len(keys))]
		keys = keys[len(batch):]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, k := range batch {
			cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(k), "=", old))
			ops = append(ops, clientv3.OpPut(k, m.node, clientv3.WithLease(m.id)))
		}
		if r, err := m.kv.Txn(ctx).If(cmps...).Then(ops...).Commit(); err == nil && r.Succeeded {
			moved += len(batch)
		}
	}
	return moved
}

func describeHolder(r *clientv3.TxnResponse, key string) string {
	if len(r.Responses) == 1 {
		if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			return fmt.Sprintf("%s is held by lease %x (value %s)", key, kvs[0].Lease, quote(kvs[0].Value))
		}
	}
	return key + " is held by another lease"
}

func (m *Member) ensurePlan(ctx context.Context) error {
	key := m.prefix + "plan"
	r, err := m.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.plan.encode())).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("etcd: read or write %s: %w", key, err)
	}
	if r.Succeeded {
		return nil
	}
	kvs := r.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) != 1 {
		return fmt.Errorf("%w: %s vanished while read", ErrBadPlan, key)
	}
	have, err := decodePlan(key, kvs[0].Value)
	if err != nil {
		return err
	}
	if have != m.plan {
		return fmt.Errorf("%w: bot %s in etcd has %s, node %s has %s; refusing to start", ErrPlanMismatch, m.bot, have, m.node, m.plan)
	}
	return nil
}

// start arms the fencing deadline of a lease granted with ttl, whose grant
// was sent at the monotonic time sent, and starts the renewal loop.
func (m *Member) start(id clientv3.LeaseID, ttl, sent time.Duration, hook func(error)) {
	m.id, m.ttl, m.afterRenew = id, ttl, hook
	m.kick = make(chan struct{}, 1)
	m.stop = make(chan struct{})
	m.loopDone = make(chan struct{})
	m.done = make(chan struct{})
	m.logged = map[string]int64{}
	m.callCtx, m.callCancel = context.WithCancel(context.Background())
	m.mu.Lock()
	now := clock.Mono(m.clock)
	m.wallAt, m.monoAt = m.clock.Now().Round(0), now
	m.deadline = sent + ttl - fenceMargin
	m.lossT = m.clock.AfterFunc(m.deadline-now, m.expire)
	m.renewT = m.clock.AfterFunc(sent+ttl/3-now, m.wake)
	m.mu.Unlock()
	go m.loop()
}

func (m *Member) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// expire runs when the fencing deadline falls due.
func (m *Member) expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil && clock.Mono(m.clock) >= m.deadline {
		m.loseLocked(fmt.Errorf("%w: no renewal answered within the TTL (deadline passed)", ErrLeaseLost))
	}
}

func (m *Member) loseLocked(err error) {
	if m.err != nil {
		return
	}
	m.err = err
	m.renewT.Stop()
	m.lossT.Stop()
	m.callCancel()
	close(m.done)
	if !errors.Is(err, ErrClosed) {
		m.log.Warn("etcd: lease lost; every shard of this node must stop", "bot", m.bot, "node", m.node, "lease", fmt.Sprintf("%x", int64(m.id)), "err", err)
	}
}

// loop sends the renewals. It is the only sender, so no two renewals are
// ever in flight.
func (m *Member) loop() {
	defer close(m.loopDone)
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
		}
		err := m.renew()
		m.mu.Lock()
		hook := m.afterRenew
		m.mu.Unlock()
		if hook != nil {
			hook(err)
		}
	}
}

// retryDelay is the wait after a failed renewal: several tries fit in the
// TTL − 1 s that the last success left.
func (m *Member) retryDelay() time.Duration { return m.ttl / 10 }

func (m *Member) renew() error {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return m.err
	}
	m.mu.Unlock()
	if m.mayRenew != nil && !m.mayRenew() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.err == nil {
			m.log.Warn("etcd: not renewing: the operator's lease has expired", "node", m.node, "remaining", max(0, m.deadline-clock.Mono(m.clock)))
			m.renewT.Reset(m.retryDelay())
		}
		return errNotRenewing
	}
	m.noteWallStep(clock.Mono(m.clock))
	a := m.keepAlive()
	r, err, sent := a.r, a.err, a.sent

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		// An answer after the deadline does not revive the membership: the
		// shards stopped, and etcd may have deleted the keys already.
		if err == nil {
			m.log.Info("etcd: a renewal answered after the fencing deadline is ignored", "node", m.node)
		}
		return m.err
	}
	now := clock.Mono(m.clock)
	switch {
	case now >= m.deadline:
		m.loseLocked(fmt.Errorf("%w: renewal answered after the fencing deadline", ErrLeaseLost))
		return m.err
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && r.TTL <= 0):
		m.loseLocked(fmt.Errorf("%w: etcd no longer knows lease %x (it expired there)", ErrLeaseLost, int64(m.id)))
		return m.err
	case err != nil:
		err = fmt.Errorf("etcd: renew lease %x: %w", int64(m.id), err)
		m.log.Warn("etcd: renewal failed; retrying", "node", m.node, "err", err, "remaining", m.deadline-now)
		m.renewT.Reset(m.retryDelay())
		return err
	}
	m.renewals++
	m.rtt = now - sent
	select {
	case m.renewed <- struct{}{}:
	default:
	}
	m.deadline = sent + time.Duration(r.TTL)*time.Second - fenceMargin
	m.lossT.Reset(m.deadline - now)
	m.renewT.Reset(sent + m.ttl/3 - now)
	return nil
}

// maxRenewTries bounds the tries of one renewal.
const maxRenewTries = 3

// hedgeAfter is the wait, in real time, before a renewal not answered yet
// is sent again: a tenth of the TTL (but 100 ms at least, many times a
// renewal's round trip), so that at TTL 3 s two more tries fit before the
// next renewal was due.
func hedgeAfter(ttl time.Duration) time.Duration { return max(ttl/10, 100*time.Millisecond) }

// renewal is the outcome of one try of a renewal.
type renewal struct {
	r    *clientv3.LeaseKeepAliveResponse
	err  error
	sent time.Duration // monotonic send time of the try
}

// keepAlive renews the lease once. KeepAliveOnce retries transient errors
// by itself until its context ends: each try is bounded by a third of the
// TTL of real time, and by the loss of the membership. A member without a
// leader refuses at once (clientv3.WithRequireLeader) and KeepAliveOnce's
// next stream goes to the next endpoint; but a member cut off from the
// others that has not noticed yet, or a follower whose leader was just
// killed, takes the renewal and holds it while it forwards it to a leader
// it cannot reach: a third of the TTL gone, and at TTL 3 s the deadline
// with it (attack22 F1). So, with several endpoints, a try not answered
// after m.hedge is sent again, to the next endpoint, while the first goes
// on (a renewal is idempotent), up to maxRenewTries; the first answer
// counts, with its own send time, so the deadline stays as safe as with
// one try.
func (m *Member) keepAlive() renewal {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(m.callCtx))
	defer cancel()
	answers := make(chan renewal, maxRenewTries)
	tries, pending := 0, 0
	try := func() {
		tries++
		pending++
		sent := clock.Mono(m.clock)
		go func() {
			tctx, tcancel := context.WithTimeout(ctx, m.ttl/3)
			r, err := m.lease.KeepAliveOnce(tctx, m.id)
			tcancel()
			answers <- renewal{r, err, sent}
		}()
	}
	try()
	var hedge <-chan time.Time
	if m.hedge > 0 {
		t := time.NewTicker(m.hedge)
		defer t.Stop()
		hedge = t.C
	}
	for {
		select {
		case a := <-answers:
			pending--
			if a.err == nil || errors.Is(a.err, rpctypes.ErrLeaseNotFound) {
				return a
			}
			if pending > 0 {
				continue // another try may still answer
			}
			if hedge == nil || tries >= maxRenewTries || ctx.Err() != nil {
				return a
			}
			try() // every try so far failed: the next endpoint, at once
		case <-hedge:
			if tries < maxRenewTries {
				try()
			}
		}
	}
}

// wallStepLogged is the smallest step of the wall clock noteWallStep logs.
const wallStepLogged = time.Second

// noteWallStep logs a line when the wall clock moved by more than
// wallStepLogged against the monotonic clock since the last renewal: an
// operator then sees that the clock jumped, and that the fencing deadline
// (monotonic) did not move with it.
func (m *Member) noteWallStep(mono time.Duration) {
	wall := m.clock.Now().Round(0) // Round(0) drops the monotonic reading
	m.mu.Lock()
	step := wall.Sub(m.wallAt) - (mono - m.monoAt)
	m.wallAt, m.monoAt = wall, mono
	m.mu.Unlock()
	if step > wallStepLogged || step < -wallStepLogged {
		m.log.Warn("etcd: the wall clock stepped; the fencing deadline runs on the monotonic clock and did not move", "node", m.node, "step", step.Round(time.Millisecond))
	}
}

// errNotRenewing: MayRenew said no.
var errNotRenewing = errors.New("etcd: renewal held back: the operator's lease has expired")

// RenewLatency is the round trip of the last answered renewal.
func (m *Member) RenewLatency() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rtt
}

// Renewed is signalled (without blocking; one pending signal at most)
// after each renewal etcd answered: the deadline moved.
func (m *Member) Renewed() <-chan struct{} { return m.renewed }

// Leave deletes members/<node> while the lease keeps the node's shard keys,
// so that the other members place the shards without this node while it
// hands them over (drain). Only a key of this membership's lease is
// deleted.
func (m *Member) Leave(ctx context.Context) error {
	key := m.prefix + "members/" + m.node
	// Before the delete: a Confirm that reads members/<node> after it
	// would take the lease for lost.
	m.left.Store(true)
	_, err := m.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", m.id)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return fmt.Errorf("etcd: leave bot %s as node %s: %w", m.bot, m.node, err)
	}
	return nil
}

// Done is closed when the membership ends: its deadline passed without a
// renewal, etcd lost the lease, or Close was called. Err says which.
func (m *Member) Done() <-chan struct{} { return m.done }

// Err is nil while the membership lasts, then wraps ErrLeaseLost or ErrClosed.
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Remaining is the time left before the self-fencing deadline, zero once
// the membership ended. It is measured on the monotonic clock, so a step of
// the wall clock does not change it.
func (m *Member) Remaining() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return 0
	}
	return max(0, m.deadline-clock.Mono(m.clock))
}

// Deadline is the self-fencing deadline: every shard of this node must have
// stopped its traffic by then unless a renewal moves it; once the
// membership ended it is the deadline that passed (or the one Close cut
// short). It is computed from Now and the monotonic time left: with the
// real clock it carries the monotonic reading, so comparisons with
// time.Now() ignore wall steps; its wall value moves with the wall clock.
func (m *Member) Deadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clock.Now().Add(m.deadline - clock.Mono(m.clock))
}

// TTL returns the lease's TTL as granted by etcd.
func (m *Member) TTL() time.Duration { return m.ttl }

// Node returns the member's node name.
func (m *Member) Node() string { return m.node }

// Prefix returns the folder of the bot's keys, for the keys other packages
// guard (sessions/<id>).
func (m *Member) Prefix() string { return m.prefix }

// LeaseID returns the etcd lease of the membership.
func (m *Member) LeaseID() clientv3.LeaseID { return m.id }

// Close ends the renewal loop and revokes the lease, which deletes
// members/<node> and every shard key of the node at once, so the others
// can acquire them without waiting for the TTL. Callers stop their shards
// first. A lease that already expired is no error. Later calls return the
// first call's result.
func (m *Member) Close() error {
	m.mu.Lock()
	m.loseLocked(ErrClosed)
	m.mu.Unlock()
	m.stopOnce.Do(func() {
		close(m.stop)
		<-m.loopDone
		m.closeErr = m.revoke(m.id)
	})
	return m.closeErr
}

// Abandon ends a lost membership like Close but leaves its lease to etcd:
// the keys it holds, if etcd still has them, are for the node's next Join
// to keep (Config.Replaces), or expire within the TTL. Revoking them now,
// with etcd back, would hand the node's shards to the others first.
func (m *Member) Abandon() {
	m.mu.Lock()
	m.loseLocked(ErrClosed)
	m.mu.Unlock()
	m.stopOnce.Do(func() {
		close(m.stop)
		<-m.loopDone
	})
}

func (m *Member) revoke(id clientv3.LeaseID) error {
	// Bounded: the lease expires by itself within the TTL anyway.
	ctx, cancel := context.WithTimeout(context.Background(), min(5*time.Second, max(m.ttl, 2*time.Second)))
	defer cancel()
	_, err := m.lease.Revoke(ctx, id)
	if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return fmt.Errorf("etcd: revoke lease %x (it expires within the TTL anyway): %w", int64(id), err)
}

// checkMember checks what a member is named by: its bot, its node and the
// plan it runs.
func checkMember(bot, node string, plan Plan) error {
	if err := checkName("bot", bot); err != nil {
		return err
	}
	if err := checkName("node", node); err != nil {
		return err
	}
	return plan.check()
}
