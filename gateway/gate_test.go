package gateway

import (
	"sync"
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

// TestIdentifyGateFloor: a shard's floor (Config.IdentifyNotBefore) holds
// its identify on top of the gate's own spacing, also before discovery
// and with the spacing off, and later identifies are spaced from the
// floor they waited for.
func TestIdentifyGateFloor(t *testing.T) {
	clk := clock.NewFake()
	t0 := clk.Now()
	win := core.DiscordWindow + 50*time.Millisecond
	floors := map[int]time.Time{}
	g := newIdentifyGate(clk, 50*time.Millisecond)
	g.notBefore = func(shard int) time.Time { return floors[shard] }
	floors[0] = t0.Add(time.Second)
	if tk := g.reserve(0, t0); !tk.at.Equal(floors[0]) {
		t.Errorf("before discovery: at +%v; want the floor, +1s", tk.at.Sub(t0))
	}
	g.setMaxConcurrency(2)
	for _, c := range []struct {
		shard int
		floor time.Duration // from t0; 0: none
		want  time.Duration
	}{
		{0, 2 * time.Second, 2 * time.Second},   // floor later than now
		{1, 0, 0},                               // other bucket, no floor
		{2, time.Second, 2*time.Second + win},   // the spacing is later than the floor
		{4, 20 * time.Second, 20 * time.Second}, // the floor is later than the spacing
		{6, 0, 20*time.Second + win},            // spaced from the floor's identify
		{3, -time.Second, win},                  // a past floor changes nothing
	} {
		floors[c.shard] = time.Time{}
		if c.floor != 0 {
			floors[c.shard] = t0.Add(c.floor)
		}
		if tk := g.reserve(c.shard, t0); !tk.at.Equal(t0.Add(c.want)) {
			t.Errorf("reserve(%d) with floor +%v: at +%v; want +%v", c.shard, c.floor, tk.at.Sub(t0), c.want)
		}
	}
	off := newIdentifyGate(clk, -1)
	off.notBefore = func(int) time.Time { return t0.Add(3 * time.Second) }
	off.setMaxConcurrency(1)
	if tk := off.reserve(0, t0); !tk.at.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("spacing off: at +%v; want the floor, +3s", tk.at.Sub(t0))
	}
}

// TestIdentifyGateHooks: through a transport, an identify whose floor is
// ahead waits for it, and each identify's write is reported with its
// moment, whether the gate held it or not.
func TestIdentifyGateHooks(t *testing.T) {
	type report struct {
		shard int
		at    time.Time
	}
	var (
		mu      sync.Mutex
		reports []report
		floor   time.Time
	)
	e := newEnv(t, envConfig{shards: 2, pacer: alwaysGrant{}, sim: gatewaysim.Config{MaxConcurrency: 2},
		tr: func(c *Config, _ *gatewaysim.Server) {
			c.IdentifyNotBefore = func(shard int) time.Time {
				mu.Lock()
				defer mu.Unlock()
				if shard == 1 {
					return floor
				}
				return time.Time{}
			}
			c.IdentifyWritten = func(shard int, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				reports = append(reports, report{shard, at})
			}
		}})
	t0 := e.clk.Now()
	mu.Lock()
	floor = t0.Add(2 * time.Second)
	mu.Unlock()
	e.node.Start()
	held := e.waitHeld()
	if held.a.Shard != 1 {
		t.Fatalf("shard %d held; want shard 1 (its floor)", held.a.Shard)
	}
	e.waitEvent(0, 0, "ready")
	e.clk.Advance(2*time.Second - time.Millisecond)
	if !e.held(held) {
		t.Fatal("shard 1 identified before its floor")
	}
	e.clk.Advance(time.Millisecond)
	e.waitEvent(1, 0, "ready")
	mu.Lock()
	defer mu.Unlock()
	want := []report{{0, t0}, {1, floor}}
	if len(reports) != len(want) {
		t.Fatalf("reports %v; want %v", reports, want)
	}
	for i, r := range reports {
		if r.shard != want[i].shard || !r.at.Equal(want[i].at) {
			t.Errorf("report %d: shard %d at +%v; want shard %d at +%v", i, r.shard, r.at.Sub(t0), want[i].shard, want[i].at.Sub(t0))
		}
	}
	if st := e.sim.Totals(); st.RefusedIdentifies != 0 || st.Identifies != 2 {
		t.Errorf("simulator: %d identifies, %d refused; want 2 and none", st.Identifies, st.RefusedIdentifies)
	}
}
