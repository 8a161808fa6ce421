package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// fakeRun is a plan run whose shards' states the test sets; each change
// is a line in the node's events, as a scheduler writes one.
type fakeRun struct {
	plan   core.Plan
	events *journal.Log
	route  *Route

	mu         sync.Mutex
	states     map[int]core.State
	started    bool
	ended      int
	dispatches []Event
}

// newFakeRun returns a run of plan whose shards are all in state.
func newFakeRun(plan core.Plan, events *journal.Log, state core.State) *fakeRun {
	f := &fakeRun{plan: plan, events: events, states: map[int]core.State{}}
	for _, id := range plan.Local {
		f.states[id] = state
	}
	f.route = NewRoute(func(shard int, session string, seq int64, typ string, d []byte) {
		f.mu.Lock()
		f.dispatches = append(f.dispatches, Event{Shard: shard, Session: session, Seq: seq, Type: typ, D: append([]byte(nil), d...)})
		f.mu.Unlock()
	})
	return f
}

func (f *fakeRun) Plan() core.Plan { return f.plan }
func (f *fakeRun) Route() *Route   { return f.route }

// Start leaves the shards' states to the test: a shard it sets READY
// before Start runs is one that was quick.
func (f *fakeRun) Start() {
	f.mu.Lock()
	f.started = true
	f.mu.Unlock()
}

func (f *fakeRun) Snapshot(dst []core.Diag) []core.Diag {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range f.plan.Local {
		dst = append(dst, core.Diag{Shard: id, State: f.states[id]})
	}
	return dst
}

func (f *fakeRun) End() error {
	f.mu.Lock()
	f.ended++
	f.mu.Unlock()
	return nil
}

// seen returns what the mover did with f.
func (f *fakeRun) seen() (started bool, ended int, dispatches []Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started, f.ended, f.dispatches
}

func (f *fakeRun) set(id int, s core.State) {
	f.mu.Lock()
	f.states[id] = s
	f.mu.Unlock()
	f.events.Append(fmt.Appendf(nil, "shard=%d state=%v\n", id, s), time.Time{})
}

// moverEnv is a Mover over fake plan runs, a fake clock and a fake
// discovery; it records every change of state.
type moverEnv struct {
	t interface {
		Helper()
		Fatalf(format string, args ...any)
	}
	m       *Mover
	clock   *clock.Fake
	events  *journal.Log
	changed chan struct{} // a change of state since the last receive
	read    int           // moves waitMove returned

	mu        sync.Mutex
	cur       *fakeRun
	built     []*fakeRun
	recommend int
	moves     [][2]State
}

// newMoverEnv runs a mover whose node runs plan.
func newMoverEnv(t testing.TB, plan core.Plan, cfg MoverConfig) *moverEnv {
	e := &moverEnv{t: t, clock: clock.NewFake(), events: journal.New(1 << 20), changed: make(chan struct{}, 1)}
	e.cur = newFakeRun(plan, e.events, core.Ready)
	cfg.Clock, cfg.Events = e.clock, e.events
	cfg.Current = func() PlanRun {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.cur
	}
	cfg.Build = func(total int, prev PlanRun) (PlanRun, error) {
		p := newFakeRun(core.Range(total, 0, total-1), e.events, core.Assigned)
		e.mu.Lock()
		e.built = append(e.built, p)
		e.mu.Unlock()
		return p, nil
	}
	cfg.Show = func(p PlanRun) {
		e.mu.Lock()
		e.cur = p.(*fakeRun)
		e.mu.Unlock()
	}
	if cfg.Recommend == nil {
		cfg.Recommend = func(context.Context) (int, int, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.recommend, 0, nil
		}
	}
	e.m = NewMover(cfg)
	e.m.onMove = func(from, to State) {
		e.mu.Lock()
		e.moves = append(e.moves, [2]State{from, to})
		e.mu.Unlock()
		select {
		case e.changed <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() {
		if err := e.m.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// next returns the move's new plan, or nil.
func (e *moverEnv) next() *fakeRun {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if e.m.next == nil {
		return nil
	}
	return e.m.next.(*fakeRun)
}

// waitMove waits for the change of state after the last it returned.
func (e *moverEnv) waitMove() [2]State {
	e.t.Helper()
	var mv [2]State
	e.waitUntil(func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		if len(e.moves) <= e.read {
			return false
		}
		mv = e.moves[e.read]
		e.read++
		return true
	})
	return mv
}

// waitUntil waits for cond, looking again at each change of state.
func (e *moverEnv) waitUntil(cond func() bool) {
	e.t.Helper()
	timeout := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-e.changed:
		case <-timeout:
			e.t.Fatalf("no change of state within 10s; state %v", e.m.Status().State)
		}
	}
}

func (e *moverEnv) eventsText() string {
	buf := make([]byte, e.events.Size()-e.events.Oldest())
	n, _ := e.events.ReadAt(buf, e.events.Oldest())
	return string(buf[:n])
}

// Every refusal known when `reshard` is written is the write's error, of
// the kind the tree turns into an errno, with its reason; /reshard says
// refused, /events has an event=rejected line, and nothing is built.
func TestMoverRefusesOnWrite(t *testing.T) {
	budget := func() core.Budget { return core.Budget{Total: 1000, Remaining: 8, Reserve: 1} }
	for _, tc := range []struct {
		name    string
		plan    core.Plan
		cfg     MoverConfig
		prepare func(m *Mover)
		line    string
		kind    error
		want    string
	}{
		{name: "as many shards as now", line: "reshard 4", kind: core.ErrUsage, want: "would have 4 shards, not more than the current 4"},
		{name: "as many once rounded", cfg: MoverConfig{MaxConcurrency: func() int { return 8 }}, line: "reshard 4", kind: core.ErrUsage, want: "not more than the current 4"},
		{name: "fewer shards than now", line: "reshard 2", kind: core.ErrUsage, want: "would have 2 shards, not more than the current 4"},
		{name: "beyond the ceiling", line: "reshard 16385", kind: core.ErrUsage, want: "beyond the ceiling of 16384"},
		{name: "at the ceiling, auto", plan: core.Range(MaxTotal, 0, MaxTotal-1), line: "reshard auto", kind: core.ErrUsage, want: "already has 16384 shards"},
		{name: "part of a plan", plan: core.Range(4, 0, 1), line: "reshard 8", kind: core.ErrUsage, want: "this node runs 2 of the plan's 4 shards"},
		{name: "a fleet", cfg: MoverConfig{Fleet: true}, line: "reshard auto", kind: core.ErrUsage, want: "shares its plan with a fleet through etcd"},
		{name: "refused by the node", prepare: func(m *Mover) { m.Refuse("supervise decides") }, line: "reshard 8", kind: core.ErrUsage, want: "reshard refused: supervise decides"},
		{name: "the budget", cfg: MoverConfig{Budget: budget}, line: "reshard 8", kind: core.ErrUsage, want: "needs 8 identifies and the budget has 7 left above its reserve of 1"},
		{name: "the rate", prepare: func(m *Mover) {
			for range MovesPerHour {
				if err := m.Limiter().Admit(); err != nil {
					panic(err)
				}
			}
		}, line: "reshard 8", kind: core.ErrBusy, want: "3 moves in the last hour already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := tc.plan
			if plan.Total == 0 {
				plan = core.Range(4, 0, 3)
			}
			e := newMoverEnv(t, plan, tc.cfg)
			if tc.prepare != nil {
				tc.prepare(e.m)
			}
			handled, err := e.m.Command(tc.line)
			if !handled || !errors.Is(err, tc.kind) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Command(%q) = %v, %v; want handled, a refusal (%v) saying %q", tc.line, handled, err, tc.kind, tc.want)
			}
			if mv := e.waitMove(); mv != [2]State{Idle, Refused} {
				t.Errorf("moves = %v; want idle to refused", mv)
			}
			if st := e.m.Status(); st.State != Refused || st.Reason != err.Error() || !st.StartedAt.IsZero() {
				t.Errorf("Status() = %+v; want refused, the reason, not started", st)
			}
			if ev := e.eventsText(); strings.Contains(ev, "event=rejected") {
				t.Errorf("events = %q; want no line of the mover's: the tree logs a refusal of the hook", ev)
			}
			if len(e.built) != 0 {
				t.Errorf("%d plans built after a refusal", len(e.built))
			}
		})
	}
}

func TestMoverBadCommands(t *testing.T) {
	e := newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{})
	for _, line := range []string{"reshard", "reshard x", "reshard 0", "reshard -3", "reshard 4 5"} {
		handled, err := e.m.Command(line)
		if !handled || !errors.Is(err, core.ErrUsage) || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "usage: reshard N|auto") {
			t.Errorf("Command(%q) = %v, %v; want an ErrUsage with the usage", line, handled, err)
		}
	}
	for _, line := range []string{"", "reset all", "reshardx 4"} {
		if handled, err := e.m.Command(line); handled || err != nil {
			t.Errorf("Command(%q) = %v, %v; want it left to the core", line, handled, err)
		}
	}
	if st := e.m.Status(); st.State != Idle || st.OldTotal != 2 {
		t.Errorf("Status() after malformed lines = %+v; want idle, old total 2", st)
	}
}

// A move by hand: checking, starting, and once every new shard is READY
// and the switch is let through, switched; the cut delivers each event
// once, the old plan ends, /reshard says so.
func TestMoverSwitch(t *testing.T) {
	e := newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{})
	gate := make(chan struct{})
	e.m.HoldSwitch(gate)
	old := e.cur
	if _, err := e.m.Command("reshard 4"); err != nil {
		t.Fatal(err)
	}
	for _, want := range [][2]State{{Idle, Checking}, {Checking, Starting}} {
		if mv := e.waitMove(); mv != want {
			t.Fatalf("move = %v; want %v", mv, want)
		}
	}
	p := e.next()
	if p == nil || p.plan.Total != 4 {
		t.Fatalf("the new plan = %+v; want 4 shards", p)
	}
	msg := func(id string) []byte { return []byte(`{"id":"` + id + `"}`) }
	old.Route().Dispatch(0, "k", 5, "MESSAGE_CREATE", msg("both"))
	p.Route().Dispatch(2, "k", 3, "MESSAGE_CREATE", msg("both")) // the copy
	p.Route().Dispatch(1, "k", 4, "MESSAGE_CREATE", msg("new only"))
	for id := range 4 {
		p.set(id, core.Ready)
	}
	if st := e.m.Status(); st.State != Starting || st.Ready != 4 || st.NewTotal != 4 {
		t.Errorf("Status() before the switch = %+v; want starting, 4 READY", st)
	}
	close(gate)
	if mv := e.waitMove(); mv != [2]State{Starting, Switched} {
		t.Fatalf("move = %v; want starting to switched", mv)
	}
	e.m.Wait() // the old plan ends after the switch
	_, oldEnded, oldGot := old.seen()
	started, newEnded, newGot := p.seen()
	if e.m.cfg.Current() != p || !started || oldEnded != 1 || newEnded != 0 {
		t.Errorf("after the switch: current is the new plan %v, new started %v, old ended %d, new ended %d; want true, true, 1, 0", e.m.cfg.Current() == p, started, oldEnded, newEnded)
	}
	if len(oldGot) != 1 || string(oldGot[0].D) != string(msg("both")) {
		t.Errorf("old plan's tree got %v; want the event both plans received, once", oldGot)
	}
	if len(newGot) != 1 || string(newGot[0].D) != string(msg("new only")) {
		t.Errorf("new plan's tree got %v; want the event only it received", newGot)
	}
	got := string(e.m.File())
	for _, want := range []string{"state switched\n", "old_total 2\n", "new_total 4\n", "ready 4\n", "reason operator: reshard 4\n", "copies_dropped 1\n", "held_at_switch 1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("/reshard = %q; want %q in it", got, want)
		}
	}
	if !strings.Contains(e.eventsText(), "event=reshard-switch old_total=2 new_total=4") {
		t.Errorf("no switch line:\n%s", e.eventsText())
	}
	// After the cut's window, both plans' dispatches bypass it.
	e.clock.Advance(DefaultWindow)
	if old.route.side.Load() != nil || p.route.side.Load() != nil {
		t.Error("a route still goes through the cut after its window")
	}
}

// A FATAL shard of the new plan aborts the move: the old plan keeps
// serving, the new one ends, and a later move may start.
func TestMoverAbort(t *testing.T) {
	e := newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{})
	gate := make(chan struct{})
	defer close(gate)
	e.m.HoldSwitch(gate)
	old := e.cur
	if _, err := e.m.Command("reshard 4"); err != nil {
		t.Fatal(err)
	}
	e.waitMove()
	e.waitMove()
	p := e.next()
	for id := range 4 {
		p.set(id, core.Ready)
	}
	p.set(3, core.Fatal)
	e.m.OnFatal(p)(3, 4011)
	if mv := e.waitMove(); mv != [2]State{Starting, Aborted} {
		t.Fatalf("move = %v; want starting to aborted", mv)
	}
	e.m.Wait()
	_, newEnded, _ := p.seen()
	_, oldEnded, _ := old.seen()
	if e.m.cfg.Current() != old || newEnded != 1 || oldEnded != 0 {
		t.Errorf("after the abort: current is the old plan %v, new ended %d, old ended %d; want true, 1, 0", e.m.cfg.Current() == old, newEnded, oldEnded)
	}
	if st := e.m.Status(); st.State != Aborted || !strings.Contains(st.Reason, "shard 3 of the new plan") {
		t.Errorf("Status() = %+v; want aborted, naming shard 3", st)
	}
	if _, err := e.m.Command("reshard 4"); err != nil {
		t.Errorf("reshard 4 after an abort = %v; want it to start", err)
	}
	for _, want := range [][2]State{{Aborted, Checking}, {Checking, Starting}} {
		if mv := e.waitMove(); mv != want {
			t.Fatalf("move = %v; want %v", mv, want)
		}
	}
	// The aborted move's goroutine, if it still looked at its FATAL
	// shard now, must not abort the move that followed.
	e.m.abort(p, "shard 3 of the new plan is FATAL")
	if st, next := e.m.Status(), e.next(); st.State != Starting || next == nil || next == p {
		t.Errorf("after a late abort of the old move: state %v, new plan %p (aborted one %p); want the second move starting", st.State, next, p)
	}
}

// A 4011 of the plan the tree shows: without Auto, refused at once saying
// how to move by hand; with it, a move to what discovery recommends.
func TestMoverOn4011(t *testing.T) {
	e := newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{})
	e.m.OnFatal(e.cur)(1, 4011)
	if st := e.m.Status(); st.State != Refused || !strings.Contains(st.Reason, "a fixed --total does not move by itself") {
		t.Errorf("Status() after a 4011 without Auto = %+v; want refused, saying how to move by hand", st)
	}
	e.m.OnFatal(e.cur)(1, 4004) // not a reshard signal
	if st := e.m.Status(); st.State != Refused {
		t.Errorf("Status() after a 4004 = %+v; want it unchanged", st)
	}

	e = newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{Auto: true})
	e.recommend = 3
	e.m.OnFatal(e.cur)(1, 4011)
	for _, want := range [][2]State{{Idle, Checking}, {Checking, Starting}} {
		if mv := e.waitMove(); mv != want {
			t.Fatalf("move = %v; want %v", mv, want)
		}
	}
	if st := e.m.Status(); st.NewTotal != 3 || st.Reason != "shard 1 closed 4011" {
		t.Errorf("Status() = %+v; want a move to 3 shards for shard 1's 4011", st)
	}
	e.m.OnFatal(e.cur)(0, 4011)
	if !strings.Contains(e.eventsText(), "event=reshard-running shard=0 plan=old old_total=2 new_total=3") {
		t.Errorf("no reshard-running line for a 4011 during the move:\n%s", e.eventsText())
	}
}

// Random sequences of what an operator, the gateway and time do take
// only moves the table lists (an unlisted one panics), and after each
// step the mover is consistent: a new plan runs exactly while starting,
// the tree shows the last plan switched to, and a write is refused with
// a reason or starts a move.
func TestMoverRandomSequences(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		auto := rapid.Bool().Draw(rt, "auto")
		e := newMoverEnv(t, core.Range(2, 0, 1), MoverConfig{Auto: auto, MaxConcurrency: func() int { return 1 }})
		e.t = rt
		defer func() {
			if err := e.m.Close(); err != nil {
				rt.Fatal(err)
			}
		}()
		var gate chan struct{}
		newGate := func() {
			gate = make(chan struct{})
			e.m.HoldSwitch(gate)
		}
		newGate()
		// settle waits until a move that started leaves checking.
		settle := func() { e.waitUntil(func() bool { return e.m.Status().State != Checking }) }
		for range rapid.IntRange(1, 20).Draw(rt, "steps") {
			before := e.m.Status()
			switch op := rapid.SampledFrom([]string{"reshard", "4011", "ready", "fatal", "switch", "time"}).Draw(rt, "op"); op {
			case "reshard":
				arg := rapid.SampledFrom([]string{"auto", "1", "2", "3", "4", "8", "16385", "x"}).Draw(rt, "arg")
				e.mu.Lock()
				e.recommend = rapid.IntRange(0, 8).Draw(rt, "recommend")
				e.mu.Unlock()
				_, err := e.m.Command("reshard " + arg)
				switch {
				case err == nil:
					if before.State.running() {
						rt.Fatalf("reshard %s during a %v move = nil; want busy", arg, before.State)
					}
					settle()
				case arg == "x":
					if !errors.Is(err, core.ErrUsage) || errors.Is(err, ErrRefused) {
						rt.Fatalf("reshard x = %v; want a usage error", err)
					}
				case before.State.running():
					if !errors.Is(err, core.ErrBusy) {
						rt.Fatalf("reshard %s during a %v move = %v; want busy", arg, before.State, err)
					}
				case !errors.Is(err, core.ErrUsage) && !errors.Is(err, core.ErrBusy):
					rt.Fatalf("reshard %s = %v; want a refusal of a kind the tree knows", arg, err)
				}
			case "4011":
				e.m.OnFatal(e.m.cfg.Current())(0, 4011)
				settle()
			case "ready":
				if p := e.next(); p != nil {
					for id := range p.plan.Total {
						p.set(id, core.Ready)
					}
				}
			case "fatal":
				if p := e.next(); p != nil {
					p.set(0, core.Fatal)
					e.m.OnFatal(p)(0, 4011)
				}
			case "switch":
				p := e.next()
				if p == nil {
					break
				}
				if ready, _ := readyCount(p); ready != p.plan.Total {
					break
				}
				close(gate)
				e.waitUntil(func() bool { return e.m.Status().State != Starting })
				if st := e.m.Status().State; st != Switched {
					rt.Fatalf("a switch let through: state %v; want switched", st)
				}
				newGate()
			case "time":
				e.clock.Advance(DefaultWindow)
			}
			st := e.m.Status()
			if (st.State == Starting) != (e.next() != nil) {
				rt.Fatalf("state %v with a new plan %v", st.State, e.next() != nil)
			}
			if st.State == Checking {
				rt.Fatalf("still checking after a step")
			}
			e.mu.Lock()
			cur, built := e.cur, e.built
			e.mu.Unlock()
			if st.State == Switched && (len(built) == 0 || cur != built[len(built)-1]) {
				rt.Fatalf("switched, and the tree shows the plan of %d", cur.plan.Total)
			}
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, mv := range e.moves {
			if !stateMoves[mv[0]].Has(mv[1]) {
				rt.Fatalf("move %v not in the table", mv)
			}
		}
	})
}
