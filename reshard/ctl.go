package reshard

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/internal/refusal"
)

// Usage is the node command that moves by hand, as /ctl's usage lists it.
const Usage = "reshard N|auto\n"

// Command runs a line written to the node's /ctl if it is a `reshard`
// command (handled false otherwise, for the core). `reshard N` moves to N
// shards, `reshard auto` to what discovery recommends. A refusal known
// when the line is written (a malformed line, a move already running, the
// node's own refusals, a given total that is no larger or beyond
// MaxTotal, a budget that cannot pay for it, the rate) is the write's
// error, with its reason (the tree logs its event=rejected line); the checks that
// take time (discovery, the community count) refuse later, in /events
// and /reshard.
func (m *Mover) Command(line string) (handled bool, err error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "reshard" {
		return false, nil
	}
	bad := func(format string, args ...any) (bool, error) {
		// The line is clipped: under 9P2000 the error string is cut at
		// 127 bytes (ERRMAX), and the reason after it must survive.
		return true, fmt.Errorf("%w: %q: %s; usage: %s", core.ErrUsage, refusal.Clip(line, refusal.MaxWord), fmt.Sprintf(format, args...), strings.TrimSpace(Usage))
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
	return true, m.start("operator: "+line, want)
}

// Status is what /reshard shows: the move under way, or the last one.
type Status struct {
	State State
	// OldTotal is the plan the move leaves; NewTotal the one it moves to,
	// 0 while not known.
	OldTotal, NewTotal int
	// Ready counts the new plan's READY shards (all of them once
	// switched).
	Ready int
	// StartedAt is zero for a move refused before it started.
	StartedAt time.Time
	// Reason is why the move started, was refused or aborted.
	Reason string
	// Cut is the last move's Cut's counts; nil before the first move
	// that started a new plan.
	Cut *Stats
}

// Status returns the move under way, or the last one.
func (m *Mover) Status() Status {
	m.mu.Lock()
	st := Status{State: m.state, OldTotal: m.oldTotal, NewTotal: m.newTotal, StartedAt: m.startedAt, Reason: m.reason}
	next, cut := m.next, m.cut
	m.mu.Unlock()
	if st.State == Idle {
		st.OldTotal = m.cfg.Current().Plan().Total
	}
	if next != nil {
		st.Ready, _ = readyCount(next)
	} else if st.State == Switched {
		st.Ready = st.NewTotal
	}
	if cut != nil {
		cs := cut.Stats()
		st.Cut = &cs
	}
	return st
}

// File is the content of /reshard: Status as `key value` lines.
func (m *Mover) File() []byte {
	st := m.Status()
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k + " " + v + "\n") }
	line("state", st.State.String())
	line("old_total", strconv.Itoa(st.OldTotal))
	if st.NewTotal == 0 {
		line("new_total", "none")
	} else {
		line("new_total", strconv.Itoa(st.NewTotal))
	}
	line("ready", strconv.Itoa(st.Ready))
	if st.StartedAt.IsZero() {
		line("started_at", "none")
	} else {
		line("started_at", st.StartedAt.UTC().Format(time.RFC3339))
	}
	if st.Reason != "" {
		line("reason", strings.ReplaceAll(st.Reason, "\n", " "))
	}
	if cs := st.Cut; cs != nil {
		line("held", strconv.Itoa(cs.Held))
		line("copies_dropped", strconv.Itoa(cs.Dropped))
		if cs.Switched || cs.Aborted {
			// What the switch (or the abort) released at once: the
			// events in flight at that moment.
			line("held_at_switch", strconv.Itoa(cs.HeldAtSwitch))
		}
	}
	return []byte(b.String())
}
