package gateway

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

func TestIdentifyGateSpacing(t *testing.T) {
	clk := clock.NewFake()
	t0 := clk.Now()
	g := newIdentifyGate(clk, 50*time.Millisecond)
	if tk := g.reserve(0, t0); !tk.at.Equal(t0) {
		t.Fatalf("before discovery: identify at %v; want at once", tk.at)
	}
	g.setMaxConcurrency(2)
	win := core.DiscordWindow + 50*time.Millisecond
	for _, c := range []struct {
		shard int
		now   time.Time
		want  time.Time
	}{
		{0, t0, t0},                           // bucket 0: first
		{1, t0, t0},                           // bucket 1: first
		{2, t0.Add(time.Second), t0.Add(win)}, // bucket 0 again: a window after the first
		{4, t0.Add(time.Second), t0.Add(2 * win)},
		{3, t0.Add(10 * time.Second), t0.Add(10 * time.Second)}, // bucket 1, long after
	} {
		if tk := g.reserve(c.shard, c.now); !tk.at.Equal(c.want) {
			t.Errorf("reserve(%d, +%v) at +%v; want +%v", c.shard, c.now.Sub(t0), tk.at.Sub(t0), c.want.Sub(t0))
		}
	}

	// A reservation given back frees its slot, unless a later one exists.
	g = newIdentifyGate(clk, 0)
	g.setMaxConcurrency(1)
	a := g.reserve(0, t0)
	b := g.reserve(0, t0)
	g.release(b)
	if tk := g.reserve(0, t0); !tk.at.Equal(b.at) {
		t.Errorf("after release: at +%v; want +%v again", tk.at.Sub(t0), b.at.Sub(t0))
	}
	g.release(a) // a later reservation stands: nothing changes
	if tk := g.reserve(0, t0); !tk.at.Equal(b.at.Add(core.DiscordWindow)) {
		t.Errorf("after a stale release: at +%v; want +%v", tk.at.Sub(t0), b.at.Add(core.DiscordWindow).Sub(t0))
	}

	if tk := newIdentifyGate(clk, -1); !func() bool {
		tk.setMaxConcurrency(1)
		tk.reserve(0, t0)
		return tk.reserve(0, t0).at.Equal(t0)
	}() {
		t.Error("a negative margin does not turn the gate off")
	}

	// Once the newest reservation is a window old, the gate keeps nothing.
	g = newIdentifyGate(clk, 0)
	g.setMaxConcurrency(16)
	for shard := range 16 {
		g.reserve(shard, clk.Now())
	}
	clk.Advance(core.DiscordWindow - time.Millisecond)
	if n := len(g.last); n != 16 {
		t.Errorf("%d buckets remembered before the window ends; want 16", n)
	}
	clk.Advance(time.Millisecond)
	if g.last != nil {
		t.Errorf("%d buckets remembered after the window; want none", len(g.last))
	}
}

// Two shards of one bucket granted together: the gate holds the second
// identify until the window and the margin have passed since the first was
// written, so the gateway refuses neither.
func TestIdentifyGateHoldsSecondIdentify(t *testing.T) {
	const margin = 50 * time.Millisecond
	e := newEnv(t, envConfig{shards: 2, pacer: alwaysGrant{}, sim: gatewaysim.Config{MaxConcurrency: 1},
		tr: func(c *Config, _ *gatewaysim.Server) { c.IdentifyMargin = margin }})
	e.node.Start()
	e.simWait("one READY", func() bool { return e.sim.Totals().Identifies == 1 })
	held := e.waitHeld()
	e.clk.Advance(core.DiscordWindow)
	if !e.held(held) {
		t.Fatalf("shard %d identified after %v; want it held for %v more", held.a.Shard, core.DiscordWindow, margin)
	}
	e.clk.Advance(margin)
	e.waitEvent(held.a.Shard, 0, "ready")
	if st := e.sim.Totals(); st.RefusedIdentifies != 0 || st.Identifies != 2 {
		t.Errorf("simulator: %d identifies, %d refused; want 2 and none", st.Identifies, st.RefusedIdentifies)
	}
}

// waitHeld waits until one connection holds an identify back, and returns
// it. The connection gets there when the simulator's Hello arrives, a
// network event the test can only poll for.
func (e *env) waitHeld() *conn {
	e.t.Helper()
	var held *conn
	if !poll(func() bool {
		e.tr.mu.Lock()
		defer e.tr.mu.Unlock()
		for c := range e.tr.conns {
			if e.held(c) {
				held = c
				return true
			}
		}
		return false
	}) {
		e.t.Fatal("no connection holds an identify back")
	}
	return held
}

func (e *env) held(c *conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pendingID != nil
}
