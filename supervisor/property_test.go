package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
)

type propProc struct {
	pid     int
	reports *Reports
	gen     int
	id      string
}

func (p *propProc) Pid() int               { return p.pid }
func (p *propProc) Signal(os.Signal) error { return nil }

// TestSupervisorProperties drives three children with random reports,
// operator commands and clock steps, and checks after every step:
//   - every state change is a move the child table lists;
//   - a child has a process exactly in starting, running and stopping;
//   - no child's attempts exceed the budget, and a failed child means
//     the supervisor is closing (every other child stopping or closed);
//   - during restart all, at most one child is stopping for a restart,
//     and the children after the current one are not touched (children
//     that crashed on their own aside);
//   - Done is closed exactly when the supervisor closes with no process
//     left, and then Err names a failed child if there is one.
func TestSupervisorProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a, _ := ByProcesses(6, 3)
		clk := clock.NewFake()
		pol := DefaultPolicy
		pol.MaxAttempts = rapid.IntRange(0, 3).Draw(rt, "max")
		pol.FailAll = rapid.Bool().Draw(rt, "fail-all")
		var mu sync.Mutex
		procs := map[string]*propProc{}
		pid := 0
		s := New(Config{Assignment: a, Policy: pol, Clock: clk, Logger: slog.New(slog.DiscardHandler),
			Launch: func(l Launch, r *Reports) (Process, error) {
				mu.Lock()
				defer mu.Unlock()
				pid++
				p := &propProc{pid: pid, reports: r, gen: l.Generation, id: l.ID}
				procs[l.ID] = p
				return p, nil
			}})
		var moves childMoveLog
		moves.watch(s)
		s.Start()
		cur := func(t *rapid.T) *propProc {
			id := rapid.SampledFrom([]string{"c0", "c1", "c2"}).Draw(t, "child")
			mu.Lock()
			defer mu.Unlock()
			return procs[id]
		}
		crashed := map[string]bool{} // exited unexpectedly since the rollout began
		rolloutGen := map[string]int{}
		check := func(t *rapid.T) {
			moves.mu.Lock()
			unlisted := moves.unlisted
			moves.mu.Unlock()
			if len(unlisted) > 0 {
				t.Fatalf("moves the child table does not list: %v", unlisted)
			}
			cs := s.Children()
			failed, closing, allFailed := "", false, true
			var failedIDs []string
			for _, c := range cs {
				allFailed = allFailed && c.State == Failed
				hasProc := c.Pid != 0
				if want := c.State == Starting || c.State == Running || c.State == Stopping || c.State == Hung; hasProc != want {
					t.Fatalf("%s: state %s with pid %d", c.ID, c.State, c.Pid)
				}
				if c.State == Failed {
					failed = c.ID
					failedIDs = append(failedIDs, c.ID)
				}
			}
			s.mu.Lock()
			closing = s.closing
			rollout := len(s.rollout) > 0 && !closing
			for _, c := range s.children {
				if c.attempts > pol.MaxAttempts {
					t.Fatalf("%s: %d attempts over %d", c.ID, c.attempts, pol.MaxAttempts)
				}
			}
			s.mu.Unlock()
			if failed != "" && !closing && (pol.FailAll || allFailed) {
				t.Fatalf("%s failed but the supervisor is not closing (fail-all %v)", failed, pol.FailAll)
			}
			if failed != "" && closing && !pol.FailAll && !allFailed && s.Err() != nil && !ownClose(s) {
				t.Fatalf("%s failed alone closed the supervisor: %v", failed, cs)
			}
			if rollout {
				// Only the rollout's current child is touched by it: the
				// children after it keep the generation they had when it
				// began, unless they crashed on their own.
				s.mu.Lock()
				for _, c := range s.rollout[1:] {
					if c.gen != rolloutGen[c.ID] && !crashed[c.ID] {
						s.mu.Unlock()
						t.Fatalf("restart all touched %s before its turn: %v", c.ID, cs)
					}
				}
				restarting := 0
				for _, c := range s.children {
					if c.state == Stopping && c.intent == exitRestart {
						restarting++
					}
				}
				s.mu.Unlock()
				if restarting > 1 {
					t.Fatalf("%d children stopping for a restart at once: %v", restarting, cs)
				}
			}
			done := false
			select {
			case <-s.Done():
				done = true
			default:
			}
			noProc := true
			for _, c := range cs {
				noProc = noProc && c.Pid == 0
			}
			if done != (closing && noProc) {
				t.Fatalf("done %v, closing %v, no process %v: %v", done, closing, noProc, cs)
			}
			if done && failed != "" {
				err := s.Err()
				named := false
				for _, id := range failedIDs {
					named = named || err != nil && containsQuoted(err.Error(), id)
				}
				if !named {
					t.Fatalf("Err() = %v; want it to name one of %v", err, failedIDs)
				}
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"ready": func(t *rapid.T) {
				if p := cur(t); p != nil {
					p.reports.Ready("")
				}
			},
			"settled": func(t *rapid.T) {
				if p := cur(t); p != nil {
					p.reports.Settled()
				}
			},
			"crash": func(t *rapid.T) {
				if p := cur(t); p != nil {
					crashed[p.id] = crashed[p.id] || ownFailure(s, p.id)
					p.reports.Exited(errors.New("exit status 1"))
				}
			},
			"alive": func(t *rapid.T) {
				if p := cur(t); p != nil {
					p.reports.Alive()
				}
			},
			"exit-after-signal": func(t *rapid.T) {
				if p := cur(t); p != nil && (stateOf(s, p.id) == Stopping || stateOf(s, p.id) == Hung) {
					crashed[p.id] = crashed[p.id] || ownFailure(s, p.id)
					p.reports.Exited(nil)
				}
			},
			"broken": func(t *rapid.T) {
				if p := cur(t); p != nil {
					crashed[p.id] = crashed[p.id] || ownFailure(s, p.id)
					p.reports.Broken(errors.New("garbage"))
				}
			},
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(1, 40).Draw(t, "seconds")) * time.Second)
			},
			"restart": func(t *rapid.T) {
				s.Restart(rapid.SampledFrom([]string{"c0", "c1", "c2"}).Draw(t, "id"))
			},
			"restart-all": func(t *rapid.T) {
				if s.RestartAll() == nil {
					clear(crashed)
					for _, c := range s.Children() {
						rolloutGen[c.ID] = c.Generation
						// Waiting for its own restart: it comes back on
						// the policy's clock, not the rollout's.
						crashed[c.ID] = c.State == Restarting
					}
				}
			},
			"": check,
		})
		// Closing always ends, once the processes exit.
		s.closeAllForTest()
		for range 10 {
			for _, c := range s.Children() {
				if c.State == Stopping || c.State == Hung {
					mu.Lock()
					p := procs[c.ID]
					mu.Unlock()
					p.reports.Exited(nil)
				}
			}
			clk.Advance(time.Minute)
		}
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			rt.Fatalf("not done after close: %v", s.Children())
		}
	})
}

// ownFailure: an exit of child id now is a failure the policy handles,
// not the rollout's restart.
func ownFailure(s *Supervisor, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.byID[id]
	return c.state == Starting || c.state == Running || c.state == Hung || c.state == Stopping && c.intent == exitFailure
}

// ownClose: the supervisor closes for a reason of its own (every child
// failed), which the property test cannot tell from its error alone.
func ownClose(s *Supervisor) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.children {
		if c.state != Failed && c.state != Closed {
			return false
		}
	}
	return true
}

func stateOf(s *Supervisor, id string) State {
	for _, c := range s.Children() {
		if c.ID == id {
			return c.State
		}
	}
	return ""
}

func containsQuoted(s, id string) bool { return strings.Contains(s, fmt.Sprintf("%q", id)) }

// closeAllForTest starts the close without waiting for it.
func (s *Supervisor) closeAllForTest() {
	s.mu.Lock()
	s.closeAllLocked()
	s.mu.Unlock()
}
