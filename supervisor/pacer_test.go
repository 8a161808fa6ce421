package supervisor

import (
	"log/slog"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/sessions/dir"
)

// spacing is what one node's gateway client keeps between two identifies
// of a bucket, counted from their writes.
const spacing = core.DiscordWindow + gateway.DefaultIdentifyMargin

type grantLog struct {
	clk    *clock.Fake
	t0     time.Time
	grants map[int][]time.Duration // shard → [granted at, floor] from t0; floor -1: none
}

func (g *grantLog) grant(shard int) func(time.Time) {
	return func(nb time.Time) {
		floor := time.Duration(-1)
		if !nb.IsZero() {
			floor = nb.Sub(g.t0)
		}
		g.grants[shard] = []time.Duration{g.clk.Now().Sub(g.t0), floor}
	}
}

func (g *grantLog) want(t *testing.T, shard int, at, floor time.Duration) {
	t.Helper()
	got, ok := g.grants[shard]
	if !ok {
		t.Fatalf("shard %d not granted; want at +%v with floor %v", shard, at, floor)
	}
	if got[0] != at || got[1] != floor {
		t.Fatalf("shard %d granted at +%v with floor %v; want +%v with floor %v", shard, got[0], got[1], at, floor)
	}
}

// TestSpacedPacerFloors: grants come at the core's rhythm and carry the
// bucket's last reported write plus 5 s and the gateway's margin; a grant
// whose bucket has an unreported write waits for the report.
func TestSpacedPacerFloors(t *testing.T) {
	clk := clock.NewFake()
	g := &grantLog{clk: clk, t0: clk.Now(), grants: map[int][]time.Duration{}}
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 2), true, clk)
	for shard := range 2 {
		now, nb, _ := p.RequestFloor(shard, false, g.grant(shard))
		if !now || !nb.IsZero() {
			t.Fatalf("shard %d: first of its bucket granted %v with floor %v; want at once, none", shard, now, nb)
		}
	}
	for shard := 2; shard < 6; shard++ {
		if now, _, _ := p.RequestFloor(shard, false, g.grant(shard)); now {
			t.Fatalf("shard %d granted at once", shard)
		}
	}
	// Shard 0's identify was written 300 ms after its grant: shard 2 is
	// granted at the core's 5 s, told to wait until 5.35 s.
	clk.Advance(300 * time.Millisecond)
	p.Written(0, clk.Now())
	clk.Advance(core.DiscordWindow - 300*time.Millisecond)
	g.want(t, 2, core.DiscordWindow, 300*time.Millisecond+spacing)
	// Shard 1's write was never reported: shard 3 waits for it.
	if _, ok := g.grants[3]; ok {
		t.Fatal("shard 3 granted before shard 1's write was reported")
	}
	clk.Advance(time.Second)
	p.Written(1, g.t0.Add(5500*time.Millisecond)) // a late report of a late write
	g.want(t, 3, 6*time.Second, 5500*time.Millisecond+spacing)
	// Shard 2's write is never reported: shard 4 goes out
	// WriteReportWait after shard 2's grant, with the floor of the last
	// write reported.
	clk.Advance(WriteReportWait - 2*time.Second)
	if _, ok := g.grants[4]; ok {
		t.Fatal("shard 4 granted before the report bound")
	}
	clk.Advance(time.Second)
	g.want(t, 4, core.DiscordWindow+WriteReportWait, 300*time.Millisecond+spacing)
	// Shard 5, held for shard 3's report, goes out on it; a report older
	// than the bucket's last one lowers no floor.
	if _, ok := g.grants[5]; ok {
		t.Fatal("shard 5 granted before shard 3's write was reported")
	}
	p.Written(3, g.t0.Add(4*time.Second))
	g.want(t, 5, core.DiscordWindow+WriteReportWait, 5500*time.Millisecond+spacing)
}

// TestSpacedPacerCancel: a grant held for a report and then cancelled
// never comes, and the next one takes its turn.
func TestSpacedPacerCancel(t *testing.T) {
	clk := clock.NewFake()
	g := &grantLog{clk: clk, t0: clk.Now(), grants: map[int][]time.Duration{}}
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 1), true, clk)
	p.RequestFloor(0, false, g.grant(0))
	_, _, cancel := p.RequestFloor(1, false, g.grant(1))
	p.RequestFloor(2, false, g.grant(2))
	clk.Advance(core.DiscordWindow) // shard 1 granted by the core, held
	cancel()
	p.Written(0, g.t0.Add(time.Second))
	if _, ok := g.grants[1]; ok {
		t.Fatal("a cancelled grant came")
	}
	clk.Advance(core.DiscordWindow)
	g.want(t, 2, 2*core.DiscordWindow, time.Second+spacing)
}

// TestSpacedPacerRequest: core.IdentifyPacer's Request, which cannot pass
// the floor on, grants at the floor; a Fluxer pacer grants as the core's.
func TestSpacedPacerRequest(t *testing.T) {
	clk := clock.NewFake()
	t0 := clk.Now()
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 1), true, clk)
	if now, _ := p.Request(0, false, func() { t.Error("shard 0 granted twice") }); !now {
		t.Fatal("the first request waits")
	}
	p.Written(0, t0.Add(time.Hour)) // ahead of the clock: taken as now
	clk.Advance(2 * time.Second)
	p.Written(0, clk.Now())
	var at time.Duration
	if now, _ := p.Request(1, false, func() { at = clk.Now().Sub(t0) }); now {
		t.Fatal("shard 1 granted at once")
	}
	_, cancel := p.Request(2, false, func() { t.Error("a cancelled request was granted") })
	clk.Advance(core.DiscordWindow - 2*time.Second)
	if at != 0 {
		t.Fatalf("granted at +%v, before its floor", at)
	}
	clk.Advance(2*time.Second + gateway.DefaultIdentifyMargin)
	if at != 2*time.Second+spacing {
		t.Fatalf("granted at +%v; want the floor, +%v", at, 2*time.Second+spacing)
	}
	cancel()
	clk.Advance(time.Minute)

	f := NewSpacedPacer(core.NewFluxerPacer(clk, core.DefaultFluxerPacing), false, clk)
	now, nb, _ := f.RequestFloor(0, false, func(time.Time) {})
	if !now || !nb.IsZero() {
		t.Errorf("Fluxer: granted %v with floor %v; want at once, none", now, nb)
	}
	f.Written(0, clk.Now()) // ignored
}

// TestSpacedPacerSeeded: a predecessor's writes, saved with the sessions
// and read back, floor the first grant of each bucket; the writes this
// process reports are saved again (item 7 of issue 23: a new supervise
// identified 2.2 s after the last READY of the same bucket, op 9).
func TestSpacedPacerSeeded(t *testing.T) {
	clk := clock.NewFake()
	folder := t.TempDir()
	prev := clk.Now().Add(-2 * time.Second)
	if err := dir.SaveIdentifyTimes(folder, dir.IdentifyTimes{MaxConcurrency: 2, Written: map[int]time.Time{1: prev}}); err != nil {
		t.Fatal(err)
	}
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 2), true, clk)
	keepIdentifyTimes(p, folder, slog.New(slog.DiscardHandler))
	if now, nb, _ := p.RequestFloor(0, false, func(time.Time) {}); !now || !nb.IsZero() {
		t.Fatalf("shard 0 (a bucket nobody wrote): granted %v, floor %v; want at once, none", now, nb)
	}
	now, nb, _ := p.RequestFloor(1, false, func(time.Time) {})
	if !now || !nb.Equal(prev.Add(spacing)) {
		t.Fatalf("shard 1: granted %v, floor %v; want at once, floor %v (the predecessor's write + 5.05 s)", now, nb, prev.Add(spacing))
	}
	w := clk.Now()
	p.Written(1, w)
	got, err := dir.LoadIdentifyTimes(folder)
	if err != nil || got.MaxConcurrency != 2 || !got.Written[1].Equal(w) {
		t.Fatalf("saved %+v, %v; want bucket 1 written at %v", got, err, w)
	}
	// Another max_concurrency: every bucket is floored by the latest.
	if f := got.Floor(3, 4); !f.Equal(w) {
		t.Fatalf("Floor(3, 4) = %v; want %v", f, w)
	}
}
