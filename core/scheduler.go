package core

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/wire"
)

// Config configures a Scheduler. Only Plan and Transport are required.
type Config struct {
	Plan      Plan
	Flavor    Flavor
	Transport Transport
	// Pacer grants identify slots; nil means an in-memory Pacer for the
	// flavor (Discord with max_concurrency 1 until told otherwise).
	Pacer IdentifyPacer
	// Lease grants the right to connect; nil refuses lease commands and
	// never gates.
	Lease Lease
	// Confirm, when set, holds every received event until a confirmation
	// that started after it was read shows the node's lease alive (see
	// Link.Confirmed); nil delivers at once (no fleet).
	Confirm Confirmer
	// Backoff is the reconnect policy; nil means DefaultBackoff.
	Backoff BackoffPolicy
	// Send is the command budget; zero means the flavor's.
	Send  SendPolicy
	Clock clock.Clock
	// Rand returns uniform values in [0, 1) for jitter; nil means
	// math/rand/v2.
	Rand   func() float64
	Logger *slog.Logger
	// EventRetention and NodeEventRetention bound each shard's events log
	// and the node's, in bytes (defaults 16 KiB and 1 MiB).
	EventRetention, NodeEventRetention int
	// ObserveEvent, when set, is told how long the core took to handle
	// each lifecycle event (the kinds in EventKinds: transport failures,
	// READY, RESUMED, reconnect, lease and identify-slot timers; never
	// dispatches), from its arrival, waiting for the shard's lock
	// included, to the end of its handling. It is called on the goroutine
	// that delivered the event, after the shard's lock is released, and
	// must be quick.
	ObserveEvent func(kind string, d time.Duration)

	// Sessions keeps each shard's snapshot across restarts (DESIGN.md
	// section 7.1); nil keeps none.
	Sessions SessionStore
	// ResumeWindow is the age beyond which a loaded snapshot is not
	// resumed; zero means the flavor's (DiscordResumeWindow,
	// FluxerResumeWindow).
	ResumeWindow time.Duration
	// Gateway is the endpoint a Fluxer shard resumes on (discovered, or
	// given with --gateway): a Fluxer snapshot whose ResumeURL is another
	// is not resumed, nor is any while Gateway is empty. Discord needs no
	// check here: the gateway client refuses a resume URL outside the
	// discovered gateway's domain.
	Gateway string
	// StoreTimeout bounds every call to Sessions; zero means StoreTimeout.
	StoreTimeout time.Duration

	// OnFatal, when set, is told of every shard that goes FATAL and the
	// close code that sent it there (0 when none), e.g. 4011 for a bot
	// that has outgrown its plan. It runs under that shard's lock: it must
	// return at once and not call the Scheduler.
	OnFatal func(shard, code int)
	// OnTokenRefused, when set, is told once per refusal of the node's
	// token (close 4004, discovery's 401 or 403), after every shard went
	// FATAL for it: a fleet node then hands its shards' keys back (see
	// node.Fleet). It runs outside every shard's lock and must not block.
	OnTokenRefused func(shard, code int, err error)
	// Events, when set, is the node's events log (the tree's /events), so
	// that a plan that replaces another carries on the same log; nil means
	// a new one of NodeEventRetention bytes.
	Events *journal.Log
}

// ReadyReset is how long a shard must stay READY before its consecutive
// failure count starts again from zero.
const ReadyReset = 60 * time.Second

// Scheduler runs the local shards of a plan.
type Scheduler struct {
	plan      Plan
	flavor    Flavor
	transport Transport
	pacer     IdentifyPacer
	lease     Lease
	confirm   Confirmer
	backoff   BackoffPolicy
	send      SendPolicy
	clock     clock.Clock
	rand      func() float64
	log       *slog.Logger

	observeEvent func(kind string, d time.Duration)

	shards map[int]*shard // fixed after New
	order  []*shard       // by shard ID
	events *journal.Log
	closed atomic.Bool
	// epoch is the last session epoch handed out to any shard.
	epoch atomic.Uint64
	// leaseMu makes each lease command atomic (see applyLease).
	leaseMu sync.Mutex

	rejectsOnce sync.Once
	rejects     *refusal.Limiter // see rejectLimiter

	sessions     SessionStore
	resumeWindow time.Duration
	gateway      string
	storeTimeout time.Duration

	onFatal func(shard, code int)
	// onTokenRefused is Config.OnTokenRefused.
	onTokenRefused func(shard, code int, err error)
	// tokenMu is taken under a shard's lock, never the other way round.
	tokenMu sync.Mutex
	// tokenRefused is the first failure of this node's token (see
	// Failure.Token) since the operator last started a shard; nil while
	// none. tokenSwept says its sweep of the other shards has begun.
	tokenRefused *tokenRefusal
	tokenSwept   bool
	// onMove, set by tests before Start, sees every move a shard makes or
	// attempts, listed or not, under that shard's lock.
	onMove func(shard int, from, to State)
}

// New validates the plan and returns a node whose shards are all ASSIGNED.
// Nothing connects until Start.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Plan.Validate(); err != nil {
		return nil, err
	}
	if cfg.Transport == nil {
		return nil, errors.New("core: Config.Transport is nil")
	}
	n := &Scheduler{
		plan:      Plan{Total: cfg.Plan.Total, Local: cfg.Plan.sorted()},
		flavor:    cfg.Flavor,
		transport: cfg.Transport,
		pacer:     cfg.Pacer,
		lease:     cfg.Lease,
		confirm:   cfg.Confirm,
		backoff:   cfg.Backoff,
		send:      cfg.Send,
		clock:     clock.Or(cfg.Clock),
		rand:      cfg.Rand,
		log:       cfg.Logger,

		observeEvent: cfg.ObserveEvent,

		sessions:     cfg.Sessions,
		resumeWindow: cfg.ResumeWindow,
		gateway:      cfg.Gateway,
		storeTimeout: cfg.StoreTimeout,

		onFatal: cfg.OnFatal, onTokenRefused: cfg.OnTokenRefused,
	}
	if n.resumeWindow <= 0 {
		n.resumeWindow = DiscordResumeWindow
		if n.flavor == Fluxer {
			n.resumeWindow = FluxerResumeWindow
		}
	}
	if n.storeTimeout <= 0 {
		n.storeTimeout = StoreTimeout
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.backoff == nil {
		n.backoff = DefaultBackoff
	}
	if n.rand == nil {
		n.rand = rand.Float64
	}
	if n.send.Limit == 0 {
		n.send = DiscordSend
		if n.flavor == Fluxer {
			n.send = FluxerSend
		}
	}
	if n.pacer == nil {
		if n.flavor == Fluxer {
			n.pacer = NewFluxerPacer(n.clock, DefaultFluxerPacing)
		} else {
			n.pacer = NewDiscordPacer(n.clock, 1)
		}
	}
	if bn, ok := n.pacer.(interface{ SetBudgetNotify(func(BudgetNote)) }); ok {
		bn.SetBudgetNotify(n.budgetNote)
	}
	retention := orDefault(cfg.EventRetention, 16<<10)
	n.events = cfg.Events
	if n.events == nil {
		n.events = journal.New(orDefault(cfg.NodeEventRetention, 1<<20))
	}
	n.shards = make(map[int]*shard, len(n.plan.Local))
	n.order = make([]*shard, len(n.plan.Local))
	for i, id := range n.plan.Local {
		s := &shard{node: n, id: id, events: journal.New(retention)}
		n.shards[id] = s
		n.order[i] = s
	}
	return n, nil
}

// budgetNote logs an identify-budget threshold to the node's events and
// to those of the shard whose slot crossed it. It runs under the pacer's
// lock, and perhaps under that shard's: it takes neither.
func (n *Scheduler) budgetNote(b BudgetNote) {
	now := n.clock.Now()
	level := slog.LevelInfo
	if b.Mark == "reserve" {
		level = slog.LevelWarn
	}
	e := newEventLine(now, b.Shard, "identify-budget", level, n.log).str("mark", b.Mark).
		int("used", int64(b.Used)).int("total", int64(b.Total)).int("remaining", int64(b.Remaining))
	if !b.ResetAt.IsZero() {
		e.str("reset_at", b.ResetAt.UTC().Format(time.RFC3339))
	}
	line := e.finish(n.log)
	n.events.Append(line, now)
	if s := n.shards[b.Shard]; s != nil {
		s.events.Append(line, now)
	}
	e.release()
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// nextEpoch returns a session epoch no shard of the node has had: larger
// than the shard's previous one, than any the node handed out, and at least
// the Unix time in milliseconds, so that a restart does not reuse one
// either (the count runs ahead of the clock only while more than one new
// session a millisecond starts, far beyond what identify pacing allows).
func (n *Scheduler) nextEpoch(prev uint64, now time.Time) uint64 {
	for {
		last := n.epoch.Load()
		e := max(last+1, prev+1, uint64(now.UnixMilli()))
		if n.epoch.CompareAndSwap(last, e) {
			return e
		}
	}
}

// Plan returns the node's plan, local IDs in ascending order.
func (n *Scheduler) Plan() Plan { return n.plan }

// Flavor returns the gateway flavor.
func (n *Scheduler) Flavor() Flavor { return n.flavor }

// Clock returns the node's clock.
func (n *Scheduler) Clock() clock.Clock { return n.clock }

// Events returns the node's events log (every local shard's lines).
func (n *Scheduler) Events() *journal.Log { return n.events }

// ShardEvents returns one shard's events log.
func (n *Scheduler) ShardEvents(id int) (*journal.Log, error) {
	s, err := n.shard(id)
	if err != nil {
		return nil, err
	}
	return s.events, nil
}

func (n *Scheduler) shard(id int) (*shard, error) {
	if s := n.shards[id]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownShard, id)
}

// Start starts every ASSIGNED shard, in shard order, so that identify slots
// are requested in that order. With a session store, each shard's snapshot
// is loaded first (many at a time), and Start returns once every shard has
// been started.
func (n *Scheduler) Start() {
	if n.sessions == nil {
		for _, s := range n.order {
			s.startAssigned()
		}
		return
	}
	n.prepareAll(n.order, true, (*shard).startAssigned)
}

// Close stops every shard (closing connections with 4000 so that sessions
// stay resumable) and refuses further commands. FATAL shards stay FATAL.
// With a session store it saves, all at once, the snapshot of every shard
// whose session stays resumable, and returns when the saves have ended.
func (n *Scheduler) Close() {
	if n.closed.Swap(true) {
		return
	}
	if n.sessions == nil {
		for _, s := range n.order {
			s.shutdown()
		}
		return
	}
	n.stopAndSave(n.order, (*shard).shutdown)
}

// Diag returns a snapshot of one shard's diagnostics.
func (n *Scheduler) Diag(id int) (Diag, error) {
	s, err := n.shard(id)
	if err != nil {
		return Diag{}, err
	}
	return s.diag(n.clock.Now()), nil
}

// Snapshot appends every local shard's diagnostics, in shard order, to dst.
// It locks one shard at a time, so it never stops the node.
func (n *Scheduler) Snapshot(dst []Diag) []Diag {
	now := n.clock.Now()
	for _, s := range n.order {
		dst = append(dst, s.diag(now))
	}
	return dst
}

// ExecNode parses and applies one line written to the node's ctl file. A
// refused line is logged to the node's events with its reason.
func (n *Scheduler) ExecNode(line string) error {
	c, err := ParseCommand(line)
	if err == nil {
		err = n.Apply(c)
	}
	if err != nil {
		n.reject(nil, line, err)
	}
	return err
}

// ExecShard parses and applies one line written to shard id's ctl file. A
// refused line is logged to that shard's events and the node's.
func (n *Scheduler) ExecShard(id int, line string) error {
	s, err := n.shard(id)
	if err != nil {
		return err
	}
	c, err := ParseShardCommand(line)
	if err == nil {
		c.Shards = []int{id}
		err = n.Apply(c)
	}
	if err != nil {
		n.reject(s, line, err)
	}
	return err
}

// Apply applies a parsed command. Named shards must all exist and the
// command must apply to each of them, or nothing is done; with All, shards
// the command does not apply to are skipped.
func (n *Scheduler) Apply(c Command) error {
	if n.closed.Load() {
		return fmt.Errorf("%w: the node is shutting down", ErrBusy)
	}
	targets := n.order
	if !c.All {
		targets = make([]*shard, 0, len(c.Shards))
		for _, id := range c.Shards {
			s, err := n.shard(id)
			if err != nil {
				return &CommandError{Word: fmt.Sprint(id), Reason: "no such shard in this node's plan", Usage: NodeUsage, Err: ErrUnknownShard}
			}
			targets = append(targets, s)
		}
		if len(targets) == 0 {
			return &CommandError{Word: c.Verb.String(), Reason: "no shard named", Usage: NodeUsage, Err: ErrUsage}
		}
	}
	if c.Verb == VerbLease {
		return n.applyLease(c, targets)
	}
	if !c.All {
		for _, s := range targets {
			if err := s.check(c.Verb); err != nil && err != errNoop {
				return err
			}
		}
	}
	switch {
	case n.sessions != nil && c.Verb == VerbStop:
		n.stopAndSave(targets, func(s *shard) { s.apply(VerbStop) })
	case n.sessions != nil && c.Verb == VerbStart:
		n.prepareAll(targets, false, func(s *shard) { s.apply(VerbStart) })
	default:
		for _, s := range targets {
			s.apply(c.Verb)
		}
	}
	return nil
}

func (n *Scheduler) applyLease(c Command, targets []*shard) error {
	if n.lease == nil {
		return fmt.Errorf("%w: lease commands are not available", ErrNoLease)
	}
	// One lease command at a time, from the backend's answer to the
	// shards: two writers racing would otherwise leave shards holding the
	// grant the backend replaced.
	n.leaseMu.Lock()
	defer n.leaseMu.Unlock()
	ids := make([]int, len(targets))
	for i, s := range targets {
		ids[i] = s.id
	}
	grants, err := n.callLease(c, ids)
	if err != nil {
		return err
	}
	for _, g := range grants {
		n.SetLease(g)
	}
	return nil
}

// callLease asks the backend for the command's grants. A panic in the
// backend refuses the command, with the panic and its stack in the node's
// events: no grant is applied, so no shard changes. The error wraps no
// sentinel (an I/O error to 9P clients), like a backend's own errors: the
// command was fine, the backend was not.
func (n *Scheduler) callLease(c Command, ids []int) (grants []LeaseGrant, err error) {
	defer func() {
		if r := recover(); r != nil {
			now := n.clock.Now()
			e := newEventLine(now, -1, "lease-panic", slog.LevelError, n.log).
				str("cmd", c.Verb.String()).str("panic", fmt.Sprint(r)).str("stack", string(debug.Stack()))
			n.events.Append(e.finish(n.log), now)
			e.release()
			grants, err = nil, fmt.Errorf("the lease backend panicked: %v; nothing changed", r)
		}
	}()
	if c.LeaseOff {
		return n.lease.Off(ids)
	}
	return n.lease.Arm(ids, c.Lease)
}

// Send queues an operator command for a READY shard. The payload must be a
// JSON object with an op the node does not reserve (heartbeat 1,
// identify 2, resume 6), at most MaxPayload bytes. It goes out at once when
// the shard's budget allows, or waits in a bounded queue. A refused command
// is logged to the shard's events and the node's.
func (n *Scheduler) Send(id int, payload []byte) error {
	s, err := n.shard(id)
	if err != nil {
		return err
	}
	if err := n.checkAndSend(s, payload); err != nil {
		n.rejectSend(s, payload, err)
		return err
	}
	return nil
}

func (n *Scheduler) checkAndSend(s *shard, payload []byte) error {
	if len(payload) > MaxPayload {
		// N/send passes an overlong line as written: the limit counts
		// white space there too, which a writer who measured the JSON
		// alone must be told.
		if ws := len(payload) - len(bytes.TrimSpace(payload)); ws > 0 {
			return fmt.Errorf("%w: %d bytes as written, white space included (%d here); the gateway takes at most %d", ErrTooLarge, len(payload), ws, MaxPayload)
		}
		return fmt.Errorf("%w: %d bytes; the gateway takes at most %d", ErrTooLarge, len(payload), MaxPayload)
	}
	// The gateway client's own reader: a check that read the op
	// differently (encoding/json folds case and keeps the last duplicate)
	// could be walked around with {"op":2,"Op":3}.
	env, err := wire.Read(payload)
	switch {
	case errors.Is(err, wire.ErrNoOp):
		return fmt.Errorf("%w: the command has no op, or one that is not an integer", ErrUsage)
	case errors.Is(err, wire.ErrAmbiguousOp):
		return fmt.Errorf("%w: the command has more than one op key, or one in another case", ErrUsage)
	case err != nil:
		return fmt.Errorf("%w: not a JSON object: %v", ErrUsage, err)
	case env.Op == 1 || env.Op == 2 || env.Op == 6:
		return fmt.Errorf("%w: op %d is sent by the node only", ErrUsage, env.Op)
	}
	return s.sendCommand(payload)
}
