package gateway

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// TestPhaseMoves: setPhaseLocked makes exactly the moves phaseMoves
// lists, refuses (false, phase unchanged) a move from a phase the
// connection is no longer in, and panics on any other.
func TestPhaseMoves(t *testing.T) {
	tr := &Transport{}
	for from := range numPhases {
		for to := range numPhases {
			listed := phaseMoves[from].Has(to)
			c := &conn{t: tr}
			c.ph.Store(uint32(from))
			got, panicked := tryMove(c, from, to)
			if panicked != !listed {
				t.Errorf("setPhaseLocked(%v, %v) panicked = %v; want %v (listed: %v)", from, to, panicked, !listed, listed)
			}
			if listed && (!got || c.phase() != to) {
				t.Errorf("setPhaseLocked(%v, %v) = %v, phase %v; want true, %v", from, to, got, c.phase(), to)
			}
			if !listed {
				continue
			}
			// Another goroutine moved it first.
			other := (from + 1) % numPhases
			c.ph.Store(uint32(other))
			if got, _ := tryMove(c, from, to); got || c.phase() != other {
				t.Errorf("setPhaseLocked(%v, %v) in %v = %v, phase %v; want false, unchanged", from, to, other, got, c.phase())
			}
		}
	}
}

func tryMove(c *conn, from, to phase) (ok, panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.setPhaseLocked(from, to), false
}

// TestPhaseOrder checks the table against the ordering the connection
// promises: every phase can end (fail, close or end at once), nothing
// goes back once a failure is reported or a close recorded, a failure is
// followed by a close, Hello is awaited once, and every phase is reached.
func TestPhaseOrder(t *testing.T) {
	for p := range numPhases {
		moves := phaseMoves[p]
		switch {
		case p < phaseFailed:
			if moves&ending != ending {
				t.Errorf("%v moves to %v; want every one of %v", p, moves, ending)
			}
		case p == phaseFailed:
			if moves != phases(phaseClosing, phaseEnded) {
				t.Errorf("failed moves to %v; want {closing ended}: a reported failure is closed", moves)
			}
		case p == phaseClosing:
			if moves != phases(phaseEnded) {
				t.Errorf("closing moves to %v; want {ended}", moves)
			}
		case p == phaseEnded:
			if moves != 0 {
				t.Errorf("ended moves to %v; want nowhere", moves)
			}
		}
		if moves.Has(phaseDialing) || p != phaseDialing && moves.Has(phaseHello) {
			t.Errorf("%v moves to %v: a connection dials and awaits Hello once", p, moves)
		}
	}
	reached := phases(phaseDialing)
	for range numPhases {
		for p := range numPhases {
			if reached.Has(p) {
				reached |= phaseMoves[p]
			}
		}
	}
	if all := phaseSet(1<<numPhases - 1); reached != all {
		t.Errorf("phases reached from dialing: %v; want %v", reached, all)
	}
}

// TestPhaseTrace follows real connections through their phases: a new
// session, a drop (reported, then closed, then ended), a resume, and a
// close on purpose, which reports nothing.
func TestPhaseTrace(t *testing.T) {
	var (
		mu    sync.Mutex
		order []*conn
		trace = map[*conn][]string{}
	)
	e := newEnv(t, envConfig{})
	e.tr.onPhase = func(c *conn, from, to phase) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := trace[c]; !ok {
			order = append(order, c)
		}
		trace[c] = append(trace[c], to.String())
	}
	traces := func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		var out [][]string
		for _, c := range order {
			out = append(out, slices.Clone(trace[c]))
		}
		return out
	}
	e.start()
	m := e.drop(0)
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, m, "resumed")
	e.node.Close()
	e.tr.Close()

	want := [][]string{
		{"hello", "identifying", "live", "failed", "closing", "ended"},
		{"hello", "resuming", "live", "closing", "ended"},
	}
	got := traces()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("phases:\n%s\nwant:\n%s", lines(got), lines(want))
	}
	if d := e.diag(0); d.State != core.Stopped {
		t.Errorf("after Close: %v; want STOPPED", d.State)
	}
}

func lines(ts [][]string) string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintln(&b, strings.Join(t, " → "))
	}
	return b.String()
}
