package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChildMoves: moveLocked makes exactly the moves childMoves lists;
// staying is no move; any other move panics and leaves the child where
// it was.
func TestChildMoves(t *testing.T) {
	for _, from := range childStates {
		for _, to := range childStates {
			listed := slices.Contains(childMoves[from], to)
			c := &child{Block: Block{ID: "c0"}, state: from}
			panicked := tryChildMove(&Supervisor{}, c, to)
			switch {
			case from == to:
				if listed || panicked || c.state != from {
					t.Errorf("moveLocked(%s, %s): listed %v, panicked %v, state %s; want unlisted, no panic, %s", from, to, listed, panicked, c.state, from)
				}
			case listed:
				if panicked || c.state != to {
					t.Errorf("moveLocked(%s, %s): panicked %v, state %s; want %s", from, to, panicked, c.state, to)
				}
			default:
				if !panicked || c.state != from {
					t.Errorf("moveLocked(%s, %s) unlisted: panicked %v, state %s; want a panic, %s", from, to, panicked, c.state, from)
				}
			}
		}
	}
}

func tryChildMove(s *Supervisor, c *child, to State) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	s.moveLocked(c, to)
	return false
}

// TestChildTable checks the table against what a child's states mean:
// every state has a row and is reached from idle; closed and failed are
// the ends; a child fails only from a state with a process (starting,
// running, stopping), and is closed from one with a process only once it
// was stopping; nothing goes back to idle.
func TestChildTable(t *testing.T) {
	hasProc := []State{Starting, Running, Stopping, Hung}
	if len(childMoves) != len(childStates) {
		t.Errorf("childMoves has %d states; want the %d of childStates", len(childMoves), len(childStates))
	}
	for _, from := range childStates {
		moves, ok := childMoves[from]
		switch {
		case !ok:
			t.Errorf("%s has no row in childMoves", from)
		case from == Closed && len(moves) != 0:
			t.Errorf("%s moves to %v; want nowhere", from, moves)
		case from == Failed && !slices.Equal(moves, []State{Starting}):
			t.Errorf("%s moves to %v; want only starting (the operator's restart)", from, moves)
		case slices.Contains(moves, Idle), slices.Contains(moves, from):
			t.Errorf("%s moves to %v; nothing goes back to idle, and staying is no move", from, moves)
		case slices.Contains(moves, Failed) && !slices.Contains(hasProc, from):
			t.Errorf("%s moves to %v; only a child with a process fails", from, moves)
		case slices.Contains(moves, Closed) && slices.Contains(hasProc, from) && from != Stopping && from != Hung:
			t.Errorf("%s moves to %v; a child with a process is stopped before it is closed", from, moves)
		}
	}
	reached := map[State]bool{Idle: true}
	for range childStates {
		for _, st := range childStates {
			if reached[st] {
				for _, to := range childMoves[st] {
					reached[to] = true
				}
			}
		}
	}
	for _, st := range childStates {
		if !reached[st] {
			t.Errorf("%s is never reached from idle", st)
		}
	}
}

// childMoveLog records the moves a supervisor's children make or attempt.
type childMoveLog struct {
	mu       sync.Mutex
	seen     map[[2]State]int
	unlisted []string
}

func (l *childMoveLog) watch(s *Supervisor) {
	s.onMove = func(id string, from, to State) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.seen == nil {
			l.seen = map[[2]State]int{}
		}
		l.seen[[2]State{from, to}]++
		if !slices.Contains(childMoves[from], to) {
			l.unlisted = append(l.unlisted, fmt.Sprintf("%s: %s → %s", id, from, to))
		}
	}
}

// TestChildMovesReached drives children through real inputs (their
// reports, the operator's restart, Close, the fake clock) until every
// move the table lists has been made, and checks that none it does not
// list was attempted.
func TestChildMovesReached(t *testing.T) {
	var log childMoveLog
	one, _ := ByProcesses(4, 1)

	// One child through its restarts until its budget is used up.
	h := newHarness(t, one, DefaultPolicy)
	log.watch(h.s)
	h.s.Start() // idle → starting
	c := func() *fakeProc { return h.last("c0") }
	c().reports.Ready("")     // starting → running
	c().reports.Exited(exit1) // running → restarting
	h.clk.Advance(time.Second)
	h.wantState("c0", Starting) // restarting → starting
	c().reports.Exited(exit1)   // starting → restarting (attempt 2)
	h.s.Restart("c0")           // restarting → starting, at once
	c().reports.Ready("")
	h.s.Restart("c0")       // running → stopping
	c().reports.Exited(nil) // stopping → starting
	h.clk.Advance(DefaultPolicy.StartupTimeout)
	h.wantState("c0", Stopping) // starting → stopping: not ready in time
	c().reports.Exited(nil)     // stopping → restarting (attempt 3)
	h.clk.Advance(DefaultPolicy.Delay(3))
	c().reports.Exited(exit1) // starting → failed: the budget is used up
	h.wantState("c0", Failed)

	// One of two children fails alone, and the operator's restart brings
	// it back with a fresh budget.
	pol0 := DefaultPolicy
	pol0.MaxAttempts = 0
	h = newHarness(t, twoChildren(t), pol0)
	log.watch(h.s)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.last("a").reports.Exited(exit1) // running → failed
	h.wantState("a", Failed)
	h.wantState("b", Running)
	if err := h.s.Restart("a"); err != nil { // failed → starting: the operator's restart
		t.Fatalf("restart of a failed child: %v", err)
	}
	h.wantState("a", Starting)
	h.last("a").reports.Ready("")
	h.wantState("a", Running)

	// No restarts allowed: a running child fails, and Close stops the
	// other.
	pol := DefaultPolicy
	pol.MaxAttempts = 0
	pol.FailAll = true
	h = newHarness(t, twoChildren(t), pol)
	log.watch(h.s)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.last("b").reports.Exited(exit1) // running → failed; a: running → stopping
	h.last("a").reports.Exited(nil)   // stopping → closed
	h.wantState("a", Closed)

	// Stopped for not starting in time, with no restarts allowed.
	h = newHarness(t, one, pol)
	log.watch(h.s)
	h.s.Start()
	h.clk.Advance(pol.StartupTimeout)
	h.last("c0").reports.Exited(nil) // stopping → failed
	h.wantState("c0", Failed)

	// Closed before it started, and while waiting to restart.
	h = newHarness(t, twoChildren(t), DefaultPolicy)
	log.watch(h.s)
	h.s.closeAllForTest() // idle → closed
	h = newHarness(t, one, DefaultPolicy)
	log.watch(h.s)
	h.s.Start()
	h.last("c0").reports.Exited(exit1)
	h.s.closeAllForTest() // restarting → closed
	h.wantState("c0", Closed)

	// Hung: killed by the watchdog, then restarted; hung again with no
	// attempt left, failed; hung while closing, closed.
	pol = DefaultPolicy
	pol.MaxAttempts = 1
	h = newWatchdogHarness(t, one, pol)
	log.watch(h.s)
	h.s.Start()
	h.last("c0").reports.Ready("")
	h.clk.Advance(pol.Watchdog) // running → hung
	h.wantState("c0", Hung)
	h.last("c0").reports.Exited(errors.New("signal: killed")) // hung → restarting
	h.wantState("c0", Restarting)
	h.clk.Advance(pol.MinDelay)
	h.last("c0").reports.Ready("")
	h.clk.Advance(pol.Watchdog)
	h.last("c0").reports.Exited(errors.New("signal: killed")) // hung → failed
	h.wantState("c0", Failed)
	h = newWatchdogHarness(t, twoChildren(t), DefaultPolicy)
	log.watch(h.s)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.last("b").reports.Alive()
	h.clk.Advance(DefaultPolicy.Watchdog / 2)
	h.last("b").reports.Alive()
	h.clk.Advance(DefaultPolicy.Watchdog / 2)
	h.wantState("b", Running)
	h.wantState("a", Hung)
	h.s.closeAllForTest()
	h.last("a").reports.Exited(errors.New("signal: killed")) // hung → closed
	h.wantState("a", Closed)

	log.mu.Lock()
	defer log.mu.Unlock()
	for _, u := range log.unlisted {
		t.Errorf("unlisted move attempted: %s", u)
	}
	for _, from := range childStates {
		for _, to := range childMoves[from] {
			if log.seen[[2]State{from, to}] == 0 {
				t.Errorf("listed move %s → %s never made", from, to)
			}
		}
	}
}

// The parent itself stalled (SIGSTOP, a frozen cgroup): its watchdog
// fires late, and the children's pushes still wait unread. That silence
// is the parent's: no child is killed for it; one silent for a whole
// watchdog after that still is. (The attack on issue 23 saw every healthy
// child SIGKILLed within 10 ms of the parent's SIGCONT.) The fake clock's
// wall jump stands in for the time the stalled parent did not see pass.
func TestWatchdogAfterParentStall(t *testing.T) {
	h := newWatchdogHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.clk.JumpWall(3 * DefaultPolicy.Watchdog) // the parent stopped
	h.clk.Advance(DefaultPolicy.Watchdog)      // its timer fires, late
	h.wantState("a", Running)
	h.wantState("b", Running)
	h.clk.Advance(DefaultPolicy.Watchdog / 2)
	h.last("b").reports.Alive() // b's pushes are read; a stays silent
	h.clk.Advance(DefaultPolicy.Watchdog / 2)
	h.wantState("a", Hung)
	h.wantState("b", Running)
}

// TestChildrenShowSilence: /children ends each line with how long ago the
// child last spoke on its control stream, so that the states the parent
// shows of its shards have an age and a child that hangs shows it before
// the watchdog kills it; "none" without a process.
func TestChildrenShowSilence(t *testing.T) {
	h := newWatchdogHarness(t, twoChildren(t), DefaultPolicy)
	if got := h.s.Children()[0].String(); !strings.HasSuffix(got, " none") {
		t.Errorf("before the start: %q; want it to end in none", got)
	}
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.clk.Advance(3 * time.Second)
	h.last("b").reports.Alive()
	h.clk.Advance(1500 * time.Millisecond)
	children := h.s.Children()
	if got := children[0].String(); !strings.HasSuffix(got, " 4.5s") {
		t.Errorf("a, silent 4.5 s: %q; want it to end in 4.5s", got)
	}
	if got := children[1].String(); !strings.HasSuffix(got, " 1.5s") {
		t.Errorf("b, heard 1.5 s ago: %q; want it to end in 1.5s", got)
	}
	if m := string(NewTree(TreeConfig{Supervisor: h.s, Assignment: h.s.cfg.Assignment}).metrics()); !strings.Contains(m, `shardfs_supervisor_silent_seconds{child="a"} 4.5`) {
		t.Errorf("/metrics does not show a's silence:\n%s", m)
	}
}
