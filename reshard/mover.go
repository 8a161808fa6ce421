package reshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// SwitchDelay is how long the switch waits after the last new shard is
// READY.
const SwitchDelay = time.Second

// recommendTimeout bounds the discovery call or community count of a
// move to what discovery recommends.
const recommendTimeout = 30 * time.Second

// PlanRun is one plan running on a node, as a move sees it: the node
// builds it from a scheduler, its gateway transport and its tree.
type PlanRun interface {
	// Plan is the plan its scheduler runs.
	Plan() core.Plan
	// Start starts its shards.
	Start()
	// Snapshot appends its shards' diagnostics, in shard order, to dst.
	Snapshot(dst []core.Diag) []core.Diag
	// End ends its sessions with 1000 and closes its transport. It takes
	// every shard's lock: a move never calls it under one.
	End() error
	// Route is where its transport delivers dispatches.
	Route() *Route
}

// Route takes one plan's dispatches from its gateway transport to the
// plan's tree or, during a move and the cut's window after it, to the
// move's Cut.
type Route struct {
	deliver func(shard int, session string, seq int64, typ string, d []byte)
	side    atomic.Pointer[cutSide]
}

type cutSide struct {
	cut *Cut
	old bool
}

// NewRoute returns a route that delivers to the plan's tree with deliver
// while no move's Cut stands in between.
func NewRoute(deliver func(shard int, session string, seq int64, typ string, d []byte)) *Route {
	return &Route{deliver: deliver}
}

// Dispatch is the plan's gateway transport's sink.
func (r *Route) Dispatch(shard int, session string, seq int64, typ string, d []byte) {
	if cs := r.side.Load(); cs != nil {
		ev := Event{Shard: shard, Session: session, Seq: seq, Type: typ, D: d}
		if cs.old {
			cs.cut.Old(ev)
		} else {
			cs.cut.New(ev)
		}
		return
	}
	r.deliver(shard, session, seq, typ, d)
}

// MoverConfig says what a Mover needs of its node. Current, Build and Show
// are required; the rest may be zero.
type MoverConfig struct {
	Flavor core.Flavor
	// Auto moves on a close 4011 (serve --total auto). Without it a 4011
	// leaves the shard FATAL and says how to move by hand.
	Auto bool
	// Fleet tells that the node shares its plan with a fleet through
	// etcd: every move is refused, saying what to do instead.
	Fleet bool
	// Current returns the plan the node's tree shows.
	Current func() PlanRun
	// Build assembles, not started, a plan of total shards that the node
	// runs whole, beside prev: it carries on prev's dispatch log and
	// shares its transport's spacing of identifies.
	Build func(total int, prev PlanRun) (PlanRun, error)
	// Show makes p the plan the node's tree shows: the switch. It runs
	// under the mover's lock and must not call the Mover.
	Show func(p PlanRun)
	// Recommend asks what the bot needs now, for `reshard auto` and a
	// 4011: Discord's discovery (its shards, and its max_concurrency or
	// 0), Fluxer's community count (and 0). Nil refuses those moves.
	Recommend func(ctx context.Context) (answer, maxConcurrency int, err error)
	// Budget is the identify budget a Discord move must fit in (nil, or a
	// zero Total: not known, not checked); MaxConcurrency rounds a new
	// total up (nil: 1).
	Budget         func() core.Budget
	MaxConcurrency func() int
	// Events is the node's /events: the moves write their lines there,
	// and a move watches it for its new shards' changes (the new plan's
	// scheduler writes there).
	Events *journal.Log
	Logger *slog.Logger
	Clock  clock.Clock
}

// Mover runs the moves of one node to a larger plan, one at a time: it
// checks the new total, starts the new plan beside the old one, waits for
// every new shard to be READY, switches, or aborts; it answers `reshard`
// on /ctl, a close 4011, and /reshard.
type Mover struct {
	cfg     MoverConfig
	log     *slog.Logger
	clock   clock.Clock
	limiter *Limiter
	wg      sync.WaitGroup // the moves and the ends of aborted plans

	mu        sync.Mutex
	state     State
	oldTotal  int
	newTotal  int
	startedAt time.Time
	reason    string  // why the last move started, was refused or aborted
	next      PlanRun // the new plan, while a move starts it
	cut       *Cut    // the last move's
	cancel    context.CancelFunc
	closed    bool
	// refusal, when set (Refuse), refuses every move with it.
	refusal string
	// gate, set by HoldSwitch, replaces the switch's SwitchDelay.
	gate <-chan struct{}
	// onMove, set by tests, sees every change of state.
	onMove func(from, to State)
}

// NewMover returns the mover of a node.
func NewMover(cfg MoverConfig) *Mover {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Events == nil {
		cfg.Events = journal.New(1 << 16)
	}
	c := clock.Or(cfg.Clock)
	return &Mover{cfg: cfg, log: log, clock: c, limiter: NewLimiter(c)}
}

// Refuse makes the mover refuse every move, by hand or on a 4011, with
// reason (what the operator should do instead): for a node whose plan
// something else decides, as a child of supervise.
func (m *Mover) Refuse(reason string) {
	m.mu.Lock()
	m.refusal = reason
	m.mu.Unlock()
}

// Limiter returns the limiter that admits the mover's moves.
func (m *Mover) Limiter() *Limiter { return m.limiter }

// HoldSwitch makes the moves that start from now on wait, once every new
// shard is READY, until gate is closed instead of SwitchDelay: a test
// acts in that second with it.
func (m *Mover) HoldSwitch(gate <-chan struct{}) {
	m.mu.Lock()
	m.gate = gate
	m.mu.Unlock()
}

// moveLocked changes the state from from to to, or reports false when the
// mover is no longer in from. A move that stateMoves does not list is a
// bug: it panics.
func (m *Mover) moveLocked(from, to State) bool {
	if !stateMoves[from].Has(to) {
		panic(fmt.Sprintf("reshard: state %v cannot move to %v", from, to))
	}
	if m.state != from {
		return false
	}
	m.state = to
	if m.onMove != nil {
		m.onMove(from, to)
	}
	return true
}

// note writes one line to the node's events log and the logger.
func (m *Mover) note(level slog.Level, event string, kv ...string) {
	now := m.clock.Now()
	var b strings.Builder
	b.WriteString("ts=" + now.UTC().Format("2006-01-02T15:04:05.000Z07:00") + " event=" + event)
	args := make([]any, 0, len(kv))
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if v == "" || strings.ContainsAny(v, " \"=\\") {
			v = strconv.Quote(v)
		}
		b.WriteString(" " + kv[i] + "=" + v)
		args = append(args, kv[i], kv[i+1])
	}
	b.WriteByte('\n')
	m.cfg.Events.Append([]byte(b.String()), now)
	m.log.Log(context.Background(), level, event, args...)
}

// errMoveRunning refuses a move while one runs.
var errMoveRunning = errors.New("a move to a new plan is running")

// start starts a move in the background, or returns its refusal when it
// can tell at once (see checkLocked); want is the new total, or 0 for
// what Recommend says. A refusal other than a move already running is
// shown by /reshard.
func (m *Mover) start(why string, want int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state.running() {
		return fmt.Errorf("%w: %w (to %d shards)", core.ErrBusy, errMoveRunning, m.newTotal)
	}
	if m.closed {
		return errors.New("the node is closing")
	}
	cur := m.cfg.Current()
	if err := m.checkLocked(cur, want); err != nil {
		m.moveLocked(m.state, Refused)
		m.reason, m.oldTotal, m.newTotal, m.startedAt = err.Error(), cur.Plan().Total, want, time.Time{}
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.moveLocked(m.state, Checking)
	m.cancel, m.reason, m.startedAt = cancel, why, m.clock.Now()
	m.oldTotal, m.newTotal = cur.Plan().Total, want
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		m.run(ctx, cur, why, want)
	}()
	return nil
}

// checkLocked returns the refusals of a move of cur to want shards (0:
// what Recommend says) that are known before any check that takes time,
// wrapped in core.ErrUsage (it will not pass) or core.ErrBusy (the rate:
// it will pass later): the node's own refusals (Refuse, a fleet, part of
// a plan), the new total when it is given (more shards than now, at most
// MaxTotal), the budget (Discord) and the rate. The rate is checked, not
// counted: the move counts only once every check passed.
func (m *Mover) checkLocked(cur PlanRun, want int) error {
	plan := cur.Plan()
	switch {
	case m.refusal != "":
		return &refused{core.ErrUsage, fmt.Errorf("%w: %s", ErrRefused, m.refusal)}
	case m.cfg.Fleet:
		return &refused{core.ErrUsage, fmt.Errorf("%w: this node shares its plan with a fleet through etcd, and a move of a fleet is not built yet (doc/reshard.md says what it needs): stop the fleet and start it with the new --total", ErrRefused)}
	case len(plan.Local) != plan.Total:
		return &refused{core.ErrUsage, fmt.Errorf("%w: this node runs %d of the plan's %d shards; only a node that runs its whole plan moves", ErrRefused, len(plan.Local), plan.Total)}
	}
	if want > 0 {
		next, err := m.given(plan.Total, want)
		if err == nil {
			err = m.checkBudget(next)
		}
		if err != nil {
			return &refused{core.ErrUsage, err}
		}
	} else if err := checkCeiling(plan.Total); err != nil {
		return &refused{core.ErrUsage, err}
	}
	if err := m.limiter.Check(); err != nil {
		return &refused{core.ErrBusy, err}
	}
	return nil
}

// refused is a move refused when it was asked for, with the kind of
// refusal the tree turns into an errno: core.ErrUsage (asking again will
// not help) or core.ErrBusy (the rate: it will pass later). Its text is
// the refusal's alone, as /reshard and /events show it.
type refused struct{ kind, err error }

func (r *refused) Error() string   { return r.err.Error() }
func (r *refused) Unwrap() []error { return []error{r.kind, r.err} }

func (m *Mover) maxConcurrency() int {
	if m.cfg.MaxConcurrency == nil {
		return 1
	}
	return m.cfg.MaxConcurrency()
}

// given is the new total of a move to want shards written by hand:
// want, rounded up as NextTotal does. A want no larger than now is
// refused before the rounding, which would make a move of `reshard 4` on
// a plan of 4 at max_concurrency 8.
func (m *Mover) given(current, want int) (int, error) {
	if want <= current {
		return 0, fmt.Errorf("%w: the new plan would have %d shards, not more than the current %d", ErrRefused, want, current)
	}
	return NextTotal(core.Discord, current, want, m.maxConcurrency())
}

// checkBudget refuses a Discord move of next shards that the identify
// budget cannot pay for; Fluxer's budget is a 60 s window that refills,
// so it only paces.
func (m *Mover) checkBudget(next int) error {
	if m.cfg.Flavor != core.Discord || m.cfg.Budget == nil {
		return nil
	}
	if b := m.cfg.Budget(); b.Total > 0 {
		return CheckBudget(next, b.Remaining, b.Reserve)
	}
	return nil
}

// refuse ends a move that checks refused before it started anything.
func (m *Mover) refuse(why string, err error) {
	m.mu.Lock()
	m.moveLocked(Checking, Refused)
	m.reason = err.Error()
	m.mu.Unlock()
	m.note(slog.LevelError, "reshard-refused", "cause", why, "reason", err.Error(), "then", "the old plan keeps serving")
}

// run is one move of old to want shards, after checkLocked passed.
func (m *Mover) run(ctx context.Context, old PlanRun, why string, want int) {
	next, err := m.nextTotal(ctx, old.Plan().Total, want)
	if err != nil {
		m.refuse(why, err)
		return
	}
	m.mu.Lock()
	m.newTotal = next // shown by /reshard, refused or not
	m.mu.Unlock()
	if err := m.checkBudget(next); err != nil {
		m.refuse(why, err)
		return
	}
	if err := m.limiter.Admit(); err != nil {
		m.refuse(why, err)
		return
	}
	p, err := m.cfg.Build(next, old)
	if err != nil {
		m.refuse(why, err)
		return
	}
	oldRoute, newRoute := old.Route(), p.Route()
	cut := New(Config{Clock: m.clock, Sink: func(isOld bool, ev Event) {
		r := newRoute
		if isOld {
			r = oldRoute
		}
		r.deliver(ev.Shard, ev.Session, ev.Seq, ev.Type, ev.D)
	}})
	oldRoute.side.Store(&cutSide{cut: cut, old: true})
	newRoute.side.Store(&cutSide{cut: cut})
	m.mu.Lock()
	m.moveLocked(Checking, Starting)
	m.newTotal, m.next, m.cut = next, p, cut
	gate := m.gate
	m.mu.Unlock()
	m.note(slog.LevelInfo, "reshard-start", "cause", why, "old_total", strconv.Itoa(old.Plan().Total), "new_total", strconv.Itoa(next))
	p.Start()

	// Wait for every new shard to be READY, looking again at each of the
	// events log's lines (the new plan writes there).
	for {
		notify := m.cfg.Events.Notify()
		ready, fatal := readyCount(p)
		if fatal >= 0 {
			m.abort(p, fmt.Sprintf("shard %d of the new plan is FATAL", fatal))
			return
		}
		if ready == next {
			break
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return
		}
	}
	if gate == nil {
		gate = m.after(SwitchDelay)
	}
	select {
	case <-gate:
	case <-ctx.Done():
		return
	}
	m.switchTo(old, p, cut)
}

// after is a channel that the mover's clock closes after d.
func (m *Mover) after(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	m.clock.AfterFunc(d, func() { close(ch) })
	return ch
}

// readyCount counts the READY shards of p and returns the first FATAL
// one, or -1.
func readyCount(p PlanRun) (ready, fatal int) {
	fatal = -1
	for _, d := range p.Snapshot(nil) {
		switch d.State {
		case core.Ready:
			ready++
		case core.Fatal:
			if fatal < 0 {
				fatal = d.Shard
			}
		}
	}
	return ready, fatal
}

// nextTotal is the new plan's size: want, or what Recommend says.
func (m *Mover) nextTotal(ctx context.Context, current, want int) (int, error) {
	if want > 0 {
		return m.given(current, want)
	}
	if m.cfg.Recommend == nil {
		return 0, fmt.Errorf("%w: no discovery to ask for the new total", ErrRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, recommendTimeout)
	defer cancel()
	answer, mc, err := m.cfg.Recommend(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if mc <= 0 {
		mc = m.maxConcurrency()
	}
	return NextTotal(m.cfg.Flavor, current, answer, mc)
}

// switchTo makes p the node's plan: the tree shows it, the held events go
// out, and the old sessions end with 1000. It does nothing when the move
// is no longer p's (an abort came first).
func (m *Mover) switchTo(old, p PlanRun, cut *Cut) {
	m.mu.Lock()
	if m.next != p || !m.moveLocked(Starting, Switched) {
		m.mu.Unlock()
		return
	}
	m.cfg.Show(p)
	m.next = nil
	// Under m.mu: an abort that comes now finds no move to abort.
	cut.Switch()
	m.mu.Unlock()
	st := cut.Stats()
	m.note(slog.LevelInfo, "reshard-switch", "old_total", strconv.Itoa(old.Plan().Total), "new_total", strconv.Itoa(p.Plan().Total),
		"held_at_switch", strconv.Itoa(st.HeldAtSwitch), "copies_dropped", strconv.Itoa(st.Dropped), "overflow", strconv.Itoa(st.Overflow))
	_ = old.End()
	// The Cut keeps recognising stragglers for its window, then forgets.
	m.forgetLater(cut, old, p)
}

// abort ends the move that started p: the old plan keeps serving. The
// move's context is cancelled, so that run does not go on to the switch,
// and the Cut releases what the new plan alone received (Cut.Abort) and
// keeps matching both plans for its window. It does nothing when p is no
// longer the move's new plan: the move ended already, and a later one
// may be starting its own.
func (m *Mover) abort(p PlanRun, why string) {
	m.mu.Lock()
	cut := m.cut
	if m.next != p || !m.moveLocked(Starting, Aborted) {
		m.mu.Unlock()
		return
	}
	m.next, m.reason = nil, why
	cancel := m.cancel
	m.mu.Unlock()
	cancel()
	cut.Abort()
	m.forgetLater(cut, m.cfg.Current(), p)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// Not under the FATAL shard's lock: End takes every shard's.
		_ = p.End()
	}()
	st := cut.Stats()
	m.note(slog.LevelError, "reshard-aborted", "reason", why, "released", strconv.Itoa(st.HeldAtSwitch),
		"ready_discarded", strconv.Itoa(st.Discarded), "then", "the old plan keeps serving")
}

// forgetLater ends the Cut's matching after its window and takes both
// plans' dispatches off it, unless a later move put its own Cut there.
func (m *Mover) forgetLater(cut *Cut, plans ...PlanRun) {
	m.clock.AfterFunc(DefaultWindow, func() {
		cut.Forget()
		for _, p := range plans {
			r := p.Route()
			if cs := r.side.Load(); cs != nil && cs.cut == cut {
				r.side.CompareAndSwap(cs, nil)
			}
		}
	})
}

// OnFatal returns p's core.Config.OnFatal: a 4011 of the plan the tree
// shows asks for a larger plan; any FATAL shard of a move's new plan
// aborts the move. It runs under a shard's lock, so a move runs on its
// own goroutine.
func (m *Mover) OnFatal(p PlanRun) func(shard, code int) {
	return func(shard, code int) {
		m.mu.Lock()
		closed, next, state, newTotal := m.closed, m.next, m.state, m.newTotal
		m.mu.Unlock()
		if closed {
			return
		}
		if next == p {
			m.abort(p, fmt.Sprintf("shard %d of the new plan went FATAL (close %d)", shard, code))
			return
		}
		if code != 4011 || p != m.cfg.Current() {
			return
		}
		total := p.Plan().Total
		if state.running() {
			// The move under way covers this shard's guilds: its new
			// plan's shards serve them from the switch.
			nt := "unknown yet"
			if newTotal > 0 {
				nt = strconv.Itoa(newTotal)
			}
			m.note(slog.LevelWarn, "reshard-running", "shard", strconv.Itoa(shard), "plan", "old",
				"old_total", strconv.Itoa(total), "new_total", nt,
				"reason", "4011 on the old plan during a move: the move under way covers this shard's guilds from the switch")
			return
		}
		why := fmt.Sprintf("shard %d closed 4011", shard)
		if reason := m.refusal4011(p); reason != "" {
			m.mu.Lock()
			if !m.state.running() {
				m.moveLocked(m.state, Refused)
				m.reason, m.oldTotal, m.newTotal, m.startedAt = reason, total, 0, time.Time{}
			}
			m.mu.Unlock()
			m.note(slog.LevelWarn, "reshard-refused", "shard", strconv.Itoa(shard), "reason", reason)
			return
		}
		if err := m.start(why, 0); err != nil && !errors.Is(err, errMoveRunning) {
			m.note(slog.LevelError, "reshard-refused", "cause", why, "reason", err.Error(), "then", "the old plan keeps serving")
		}
	}
}

// refusal4011 is why a 4011 of p does not start a move, or "" when it
// does: with Auto, a move (whose checks may still refuse it).
func (m *Mover) refusal4011(p PlanRun) string {
	m.mu.Lock()
	refusal := m.refusal
	m.mu.Unlock()
	const outgrew = "4011: the bot outgrew its plan; "
	plan := p.Plan()
	switch {
	case refusal != "":
		return outgrew + refusal
	case m.cfg.Auto:
		return "" // the move's own checks refuse a fleet or part of a plan
	case m.cfg.Fleet:
		return outgrew + "a fleet does not move to a new plan yet (doc/reshard.md says what it needs): stop the fleet and start it with the new --total"
	case len(plan.Local) != plan.Total:
		return outgrew + "this node runs part of it (--shards, or a block of supervise), which does not move by itself: start the nodes again with the new --total"
	}
	return outgrew + "a fixed --total does not move by itself: write reshard N or reshard auto to /ctl"
}

// Wait waits for the moves under way and the ends of aborted plans.
func (m *Mover) Wait() { m.wg.Wait() }

// Close cancels a move under way, waits for it, and ends the new plan of
// a move cut short: its sessions are of no use. Later moves are refused.
func (m *Mover) Close() error {
	m.mu.Lock()
	m.closed = true
	if m.cancel != nil {
		m.cancel()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.mu.Lock()
	next := m.next
	m.mu.Unlock()
	if next != nil {
		return next.End()
	}
	return nil
}
