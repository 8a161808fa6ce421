package node

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

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/lease/local"
	"github.com/shardfs/shardfs/reshard"
	"github.com/shardfs/shardfs/shardfs"
)

// Resharding (DESIGN.md section 7.5). Decisions where the design is
// silent:
//   - Only a node that runs its whole plan moves (serve without --shards):
//     a node that runs part of a plan cannot choose its part of the next
//     one. With --etcd and under supervise (a child refuses even when it
//     runs the whole plan: RefuseMoves) a move is refused with a line that
//     says so; the README says what each would need.
//   - Automatic moves answer a close 4011 when Config.Reshard is set
//     (serve --total auto); `reshard N` on /ctl moves by hand to N shards,
//     `reshard auto` to what discovery recommends, with the same checks.
//   - Order of the checks: a move already running; the node's own
//     refusals (RefuseMoves, a fleet, part of a plan); the new total
//     (discovery, or for Fluxer the community count); the budget (Discord:
//     remaining − reserve must pay for every new shard; Fluxer's budget is
//     a 60 s window that refills, so it only paces); then the rate (3
//     moves an hour), last, so that a refused move does not use up one of
//     the 3 (a fourth 4011 within the hour still costs a discovery call or
//     a community count before it is refused). A refusal leaves the old
//     plan serving, the 4011 shard FATAL, and says why in /events
//     (event=reshard-refused) and /reshard.
//   - A 4011 of the old plan while a move runs writes its own line
//     (event=reshard-running plan=old): the move under way serves that
//     shard's guilds from the switch.
//   - The new plan shares the node's identify pacer (one budget, buckets
//     by shard id as Discord counts them) and its transport's identify
//     gate, its events log (/events: the new plan's shards write their
//     lines there during the move, after a line event=reshard-start that
//     names the new total; the lines do not say which plan, the
//     reshard-start and reshard-switch lines frame them) and its dispatch
//     log, which reshard.Cut feeds so that each dispatch appears once.
//   - The switch waits SwitchDelay after the last new shard is READY, so
//     that what the gateway sent the old sessions before that READY has
//     arrived (the order per guild at the cut, see package reshard; a
//     fixed wait, no heartbeat acknowledgement), then the tree shows the
//     new plan, the held events go out, and the old sessions close with
//     1000. The Cut keeps matching stragglers for its window, then
//     forgets.
//   - A new shard that goes FATAL during the move (a 4011 of the new plan,
//     a refused token) aborts it, also while it waits for the switch: the
//     move's context ends and the switch checks that the move is still
//     its own, the new sessions end with 1000, the Cut releases what it
//     held but the new sessions' READY (reshard.Cut.Abort: the guilds of
//     the old plan's 4011 shard reached only the new plan), and the old
//     plan keeps serving. What the new connections had not read when
//     they close is not delivered: for the guilds of the old 4011 shard,
//     as everything the gateway sends them after the abort, until a later
//     move.

// SwitchDelay is how long the switch waits after the last new shard is
// READY.
const SwitchDelay = time.Second

// ReshardUsage is the node command that moves by hand.
const ReshardUsage = "reshard N|auto\n"

// planRun is one plan's running parts.
type planRun struct {
	total     int
	transport *gateway.Transport
	core      *core.Scheduler
	tree      *shardfs.Tree
	lease     *local.Lease
	// side, during and shortly after a move, routes dispatches through
	// the move's Cut.
	side atomic.Pointer[cutSide]
}

type cutSide struct {
	cut *reshard.Cut
	old bool
}

// dispatch is the gateway transport's sink.
func (p *planRun) dispatch(shard int, seq int64, name string, d []byte) {
	if cs := p.side.Load(); cs != nil {
		ev := reshard.Event{Shard: shard, Seq: seq, Type: name, D: d}
		if cs.old {
			cs.cut.Old(ev)
		} else {
			cs.cut.New(ev)
		}
		return
	}
	p.tree.Dispatch(shard, seq, name, d)
}

// Move states shown in /reshard.
const (
	moveIdle     = "idle"
	moveChecking = "checking"
	moveStarting = "starting"
	moveSwitched = "switched"
	moveRefused  = "refused"
	moveAborted  = "aborted"
)

// mover runs the moves of one node.
type mover struct {
	limiter *core.ReshardLimiter

	mu        sync.Mutex
	state     string
	oldTotal  int
	newTotal  int
	startedAt time.Time
	reason    string // why the last move started, was refused or aborted
	next      *planRun
	cut       *reshard.Cut
	running   bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	// refusal, when set (RefuseMoves), refuses every move with it.
	refusal string
	// switchGate, set by a test before a move, replaces the switch's
	// SwitchDelay: the switch waits until it is closed.
	switchGate chan struct{}
}

// RefuseMoves makes the node refuse every move to a larger plan, by hand
// or on a 4011, with reason (what the operator should do instead): for a
// node whose plan something else decides, as a child of supervise. Call
// it before Start.
func (s *Node) RefuseMoves(reason string) {
	s.move.mu.Lock()
	s.move.refusal = reason
	s.move.mu.Unlock()
}

// current returns the plan the tree shows.
func (s *Node) current() *planRun {
	s.planMu.RLock()
	defer s.planMu.RUnlock()
	return s.cur
}

// Current returns the core and the tree of the plan the node runs now:
// the fields Node and Tree are the plan it started with.
func (s *Node) Current() (*core.Scheduler, *shardfs.Tree) {
	p := s.current()
	return p.core, p.tree
}

// note writes one line to the node's events log and the logger.
func (s *Node) note(level slog.Level, event string, kv ...string) {
	now := s.clock.Now()
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
	s.events.Append([]byte(b.String()), now)
	s.log.Log(context.Background(), level, event, args...)
}

// onFatal is the current plan's core.Config.OnFatal: a 4011 asks for a
// larger plan. It runs under a shard's lock, so the move runs on its own
// goroutine.
func (s *Node) onFatal(p *planRun) func(shard, code int) {
	return func(shard, code int) {
		if s.closed.Load() {
			return
		}
		m := &s.move
		m.mu.Lock()
		next, running, newTotal, refusal := m.next, m.running, m.newTotal, m.refusal
		m.mu.Unlock()
		if next == p {
			s.abortMove(fmt.Sprintf("shard %d of the new plan went FATAL (close %d)", shard, code))
			return
		}
		if code != 4011 || p != s.current() {
			return
		}
		if running {
			// The move under way covers this shard's guilds: its new
			// plan's shards serve them from the switch.
			nt := "unknown yet"
			if newTotal > 0 {
				nt = strconv.Itoa(newTotal)
			}
			s.note(slog.LevelWarn, "reshard-running", "shard", strconv.Itoa(shard), "plan", "old",
				"old_total", strconv.Itoa(p.total), "new_total", nt,
				"reason", "4011 on the old plan during a move: the move under way covers this shard's guilds from the switch")
			return
		}
		if refusal != "" || !s.cfg.Reshard {
			reason := "4011: the bot outgrew its plan; a fixed --total does not move by itself: write reshard N or reshard auto to /ctl"
			switch {
			case refusal != "":
				reason = "4011: the bot outgrew its plan; " + refusal
			case s.Fleet != nil:
				reason = "4011: the bot outgrew its plan; a fleet does not move to a new plan yet (README, Bigger plans without downtime, says what it needs): stop the fleet and start it with the new --total"
			case len(p.core.Plan().Local) != p.total:
				reason = "4011: the bot outgrew its plan; this node runs part of it (--shards, or a block of supervise), which does not move by itself: start the nodes again with the new --total"
			}
			m.mu.Lock()
			if !m.running {
				m.state, m.reason, m.oldTotal, m.newTotal, m.startedAt = moveRefused, reason, p.total, 0, time.Time{}
			}
			m.mu.Unlock()
			s.note(slog.LevelWarn, "reshard-refused", "shard", strconv.Itoa(shard), "reason", reason)
			return
		}
		s.startMove(fmt.Sprintf("shard %d closed 4011", shard), 0)
	}
}

// command is the tree's hook for node commands the core does not know.
func (s *Node) command(line string) (bool, error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "reshard" {
		return false, nil
	}
	bad := func(format string, args ...any) (bool, error) {
		err := fmt.Errorf("%w: %q: %s; usage: %s", core.ErrUsage, line, fmt.Sprintf(format, args...), strings.TrimSpace(ReshardUsage))
		s.note(slog.LevelWarn, "rejected", "command", line, "reason", err.Error())
		return true, err
	}
	if len(f) != 2 {
		return bad("want one argument")
	}
	want := 0
	if f[1] != "auto" {
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 {
			return bad("%q is not a shard count", f[1])
		}
		want = n
	}
	if err := s.startMove("operator: "+line, want); err != nil {
		if errors.Is(err, errMoveRunning) {
			s.note(slog.LevelWarn, "rejected", "command", line, "reason", err.Error())
			return true, fmt.Errorf("%w: %v", core.ErrBusy, err)
		}
		return true, err
	}
	return true, nil
}

var errMoveRunning = errors.New("a move to a new plan is running")

// startMove starts a move in the background unless one runs. want is the
// new total, or 0 for discovery's.
func (s *Node) startMove(why string, want int) error {
	m := &s.move
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running {
		return fmt.Errorf("%w (to %d shards)", errMoveRunning, m.newTotal)
	}
	if s.closed.Load() {
		return errors.New("the node is closing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.running, m.cancel = true, cancel
	m.state, m.reason, m.startedAt = moveChecking, why, s.clock.Now()
	m.oldTotal, m.newTotal = s.current().total, want
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		s.runMove(ctx, why, want)
	}()
	return nil
}

// refuse ends a move before it started anything.
func (s *Node) refuse(why string, err error) {
	m := &s.move
	m.mu.Lock()
	m.state, m.reason, m.running = moveRefused, err.Error(), false
	m.mu.Unlock()
	s.note(slog.LevelError, "reshard-refused", "cause", why, "reason", err.Error(), "then", "the old plan keeps serving")
}

func (s *Node) runMove(ctx context.Context, why string, want int) {
	old := s.current()
	s.move.mu.Lock()
	refusal := s.move.refusal
	s.move.mu.Unlock()
	if refusal != "" {
		s.refuse(why, fmt.Errorf("%w: %s", core.ErrReshard, refusal))
		return
	}
	if s.Fleet != nil {
		s.refuse(why, fmt.Errorf("%w: this node shares its plan with a fleet through etcd, and a move of a fleet is not built yet (README, Bigger plans without downtime, says what it needs): stop the fleet and start it with the new --total", core.ErrReshard))
		return
	}
	if len(old.core.Plan().Local) != old.total {
		s.refuse(why, fmt.Errorf("%w: this node runs %d of the plan's %d shards; only a node that runs its whole plan moves", core.ErrReshard, len(old.core.Plan().Local), old.total))
		return
	}
	next, err := s.nextTotal(ctx, old.total, want)
	if err != nil {
		s.refuse(why, err)
		return
	}
	s.move.mu.Lock()
	s.move.newTotal = next // shown by /reshard, refused or not
	s.move.mu.Unlock()
	if s.cfg.Flavor == core.Discord {
		b := s.Pacer.Budget()
		if b.Total > 0 {
			if err := core.CheckReshardBudget(next, b.Remaining, b.Reserve); err != nil {
				s.refuse(why, err)
				return
			}
		}
	}
	if err := s.move.limiter.Admit(); err != nil {
		s.refuse(why, err)
		return
	}
	p, err := s.buildPlan(core.Range(next, 0, next-1), old)
	if err != nil {
		s.refuse(why, err)
		return
	}
	cut := reshard.New(reshard.Config{Clock: s.clock, Sink: func(isOld bool, ev reshard.Event) {
		tree := p.tree
		if isOld {
			tree = old.tree
		}
		tree.Dispatch(ev.Shard, ev.Seq, ev.Type, ev.D)
	}})
	old.side.Store(&cutSide{cut: cut, old: true})
	p.side.Store(&cutSide{cut: cut})
	m := &s.move
	m.mu.Lock()
	m.state, m.newTotal, m.next, m.cut = moveStarting, next, p, cut
	m.mu.Unlock()
	s.note(slog.LevelInfo, "reshard-start", "cause", why, "old_total", strconv.Itoa(old.total), "new_total", strconv.Itoa(next))
	p.core.Start()

	// Wait for every new shard to be READY, looking again at each of the
	// events log's lines (the new plan writes there).
	for {
		notify := s.events.Notify()
		ready, fatal := p.readyCount()
		if fatal >= 0 {
			s.abortMove(fmt.Sprintf("shard %d of the new plan is FATAL", fatal))
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
	select {
	case <-s.switchDelay():
	case <-ctx.Done():
		return
	}
	s.switchTo(old, p, cut)
}

// switchDelay is closed SwitchDelay after the last new shard is READY; a
// test may hold the switch with mover.switchGate.
func (s *Node) switchDelay() <-chan struct{} {
	if g := s.move.switchGate; g != nil {
		return g
	}
	return s.after(SwitchDelay)
}

// after is a channel that the node's clock closes after d.
func (s *Node) after(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	s.clock.AfterFunc(d, func() { close(ch) })
	return ch
}

func (s *Node) moveNext() *planRun {
	s.move.mu.Lock()
	defer s.move.mu.Unlock()
	return s.move.next
}

// readyCount counts the READY shards of p and returns the first FATAL
// one, or -1.
func (p *planRun) readyCount() (ready, fatal int) {
	fatal = -1
	for _, d := range p.core.Snapshot(nil) {
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

// nextTotal is the new plan's size: want, or what discovery (Discord) or
// the community count (Fluxer) says.
func (s *Node) nextTotal(ctx context.Context, current, want int) (int, error) {
	mc := s.Pacer.MaxConcurrency()
	if want > 0 {
		return core.NextTotal(core.Discord, current, want, mc)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.cfg.Flavor == core.Fluxer {
		n, err := gateway.CountGuilds(ctx, nil, s.cfg.Flavor, s.cfg.API, s.cfg.Token)
		if err != nil {
			return 0, fmt.Errorf("%w: %v", core.ErrReshard, err)
		}
		return core.NextTotal(core.Fluxer, current, n, mc)
	}
	d, err := gateway.Discover(ctx, nil, s.cfg.Flavor, s.cfg.API, s.cfg.Token)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", core.ErrReshard, err)
	}
	if d.StartLimit.MaxConcurrency > 0 {
		mc = d.StartLimit.MaxConcurrency
	}
	return core.NextTotal(core.Discord, current, d.Shards, mc)
}

// switchTo makes p the node's plan: the tree shows it, the held events go
// out, and the old sessions end with 1000. It does nothing when the move
// is no longer p's (an abort came first).
func (s *Node) switchTo(old, p *planRun, cut *reshard.Cut) {
	m := &s.move
	m.mu.Lock()
	if m.next != p || m.state != moveStarting {
		m.mu.Unlock()
		return
	}
	s.planMu.Lock()
	s.cur = p
	s.planMu.Unlock()
	m.state, m.next, m.running = moveSwitched, nil, false
	// Under m.mu: an abort that comes now finds no move to abort.
	cut.Switch()
	m.mu.Unlock()
	st := cut.Stats()
	s.note(slog.LevelInfo, "reshard-switch", "old_total", strconv.Itoa(old.total), "new_total", strconv.Itoa(p.total),
		"held_at_switch", strconv.Itoa(st.HeldAtSwitch), "copies_dropped", strconv.Itoa(st.Dropped), "overflow", strconv.Itoa(st.Overflow))
	old.core.End()
	_ = old.transport.Close()
	// The Cut keeps recognising stragglers for its window, then forgets.
	s.forgetLater(cut, old, p)
}

// abortMove ends a move that started its new plan: the old one keeps
// serving. The move's context is cancelled, so that runMove does not go on
// to the switch, and the Cut releases what the new plan alone received
// (reshard.Cut.Abort) and keeps matching both plans for its window.
func (s *Node) abortMove(why string) {
	m := &s.move
	m.mu.Lock()
	p, cut := m.next, m.cut
	if p == nil {
		m.mu.Unlock()
		return
	}
	m.next, m.state, m.reason, m.running = nil, moveAborted, why, false
	cancel := m.cancel
	m.mu.Unlock()
	cancel()
	cut.Abort()
	s.forgetLater(cut, s.current(), p)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// Not under the FATAL shard's lock: End takes every shard's.
		p.core.End()
		_ = p.transport.Close()
	}()
	st := cut.Stats()
	s.note(slog.LevelError, "reshard-aborted", "reason", why, "released", strconv.Itoa(st.HeldAtSwitch),
		"ready_discarded", strconv.Itoa(st.Discarded), "then", "the old plan keeps serving")
}

// forgetLater ends the Cut's matching after its window and takes both
// plans' dispatches off it, unless a later move put its own Cut there.
func (s *Node) forgetLater(cut *reshard.Cut, plans ...*planRun) {
	s.clock.AfterFunc(reshard.DefaultWindow, func() {
		cut.Forget()
		for _, p := range plans {
			if cs := p.side.Load(); cs != nil && cs.cut == cut {
				p.side.CompareAndSwap(cs, nil)
			}
		}
	})
}

// reshardFile is /reshard.
func (s *Node) reshardFile() []byte {
	m := &s.move
	m.mu.Lock()
	state, oldT, newT, started, reason, next, cut := m.state, m.oldTotal, m.newTotal, m.startedAt, m.reason, m.next, m.cut
	m.mu.Unlock()
	if state == "" {
		state, oldT = moveIdle, s.current().total
	}
	ready := 0
	if next != nil {
		ready, _ = next.readyCount()
	} else if state == moveSwitched {
		ready = newT
	}
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k + " " + v + "\n") }
	line("state", state)
	line("old_total", strconv.Itoa(oldT))
	if newT == 0 {
		line("new_total", "none")
	} else {
		line("new_total", strconv.Itoa(newT))
	}
	line("ready", strconv.Itoa(ready))
	if started.IsZero() {
		line("started_at", "none")
	} else {
		line("started_at", started.UTC().Format(time.RFC3339))
	}
	if reason != "" {
		line("reason", strings.ReplaceAll(reason, "\n", " "))
	}
	if cut != nil {
		st := cut.Stats()
		line("held", strconv.Itoa(st.Held))
		line("copies_dropped", strconv.Itoa(st.Dropped))
		if st.Switched || st.Aborted {
			// What the switch (or the abort) released at once: the
			// events in flight at that moment.
			line("held_at_switch", strconv.Itoa(st.HeldAtSwitch))
		}
	}
	return []byte(b.String())
}

// buildPlan assembles a plan's transport, core and tree. prev is the plan
// it replaces (nil for the first): the new one carries on its dispatch
// log and shares its transport's spacing of identifies.
func (s *Node) buildPlan(plan core.Plan, prev *planRun) (*planRun, error) {
	cfg := s.cfg
	p := &planRun{total: plan.Total, lease: local.New(s.clock)}
	// The fleet's lease, session store and identify pacer replace the
	// node's own (a fleet never moves to a new plan, so only a first plan
	// has a fleet).
	var lease core.Lease = p.lease
	var pacer core.IdentifyPacer = s.Pacer
	onStartLimit, budget := s.Pacer.SetStartLimit, s.Pacer.Budget
	if cfg.IdentifyPacer != nil {
		pacer = cfg.IdentifyPacer
	}
	fleet := s.Fleet
	if prev != nil {
		fleet = nil
	}
	if fleet != nil {
		lease = fleet
		if fleet.Identify != nil {
			pacer, onStartLimit, budget = fleet.Identify, fleet.Identify.SetStartLimit, fleet.Identify.Budget
		}
	}
	gc := gateway.Config{
		Flavor: cfg.Flavor, Token: cfg.Token, Intents: cfg.Intents,
		API: cfg.API, GatewayURL: cfg.GatewayURL, Compression: cfg.Compression,
		Sink:              p.dispatch,
		OnStartLimit:      onStartLimit,
		OnSession:         cfg.OnSession,
		IdentifyNotBefore: cfg.IdentifyNotBefore, IdentifyWritten: cfg.IdentifyWritten,
		Clock: cfg.Clock, Logger: s.log.With("component", "gateway", "total", plan.Total),
	}
	var dispatch *journal.Merged
	if prev != nil {
		gc.ShareIdentifyGate, dispatch = prev.transport, prev.tree.NodeDispatchLog()
	}
	tr, err := gateway.New(gc)
	if err != nil {
		return nil, err
	}
	p.transport = tr
	var tree *shardfs.Tree // set below; ObserveEvent runs only after Start
	observe := func(kind string, d time.Duration) {
		tree.ObserveEvent(kind, d)
		if cfg.ObserveEvent != nil {
			cfg.ObserveEvent(kind, d)
		}
	}
	c, err := core.New(core.Config{
		Plan: plan, Flavor: cfg.Flavor, Transport: tr, Pacer: pacer, Lease: lease,
		Backoff: cfg.Backoff, Clock: cfg.Clock, Logger: s.log.With("component", "core", "total", plan.Total),
		ObserveEvent: observe,
		Sessions:     cfg.Sessions, ResumeWindow: cfg.ResumeWindow, Gateway: orString(cfg.Gateway, cfg.GatewayURL),
		OnFatal: s.onFatal(p), Events: s.events,
	})
	if err != nil {
		tr.Close()
		return nil, err
	}
	p.core = c
	reg := cfg.Registry
	if dispatch != nil {
		reg = nil // the first plan's tree registered its collector there
	}
	tc := shardfs.Config{
		Scheduler: c, Info: s.info, Identify: budget, LeaseBackend: "local",
		DispatchRetention: cfg.DispatchRetention, NodeDispatchRetention: cfg.NodeDispatchRetention,
		Registry: reg, Logger: s.log, Dispatch: dispatch,
		Files:   []fsrv.File{&fsrv.Text{Name: "reshard", Content: s.reshardFile}},
		Command: s.command, CommandUsage: ReshardUsage,
	}
	if fleet != nil {
		fleet.treeConfig(&tc)
		// reshard first (it refuses in a fleet, saying why), then drain.
		drain, usage := tc.Command, tc.CommandUsage
		tc.Command = func(line string) (bool, error) {
			if handled, err := s.command(line); handled {
				return handled, err
			}
			return drain(line)
		}
		tc.CommandUsage = ReshardUsage + usage
	}
	tree = shardfs.New(tc)
	if fleet != nil {
		fleet.register(tree.Registry())
	}
	p.tree = tree
	return p, nil
}
