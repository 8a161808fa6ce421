package local

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
)

func TestGenerationGrowsOnlyAfterExpiryOrOff(t *testing.T) {
	c := clock.NewFake()
	l := New(c)
	steps := []struct {
		name    string
		do      func() uint64
		wantGen uint64
	}{
		{"arm from off", func() uint64 { g, _ := l.Arm([]int{3}, 10*time.Second); return g[0].Generation }, 1},
		{"renew before expiry", func() uint64 {
			c.Advance(5 * time.Second)
			g, _ := l.Arm([]int{3}, 10*time.Second)
			return g[0].Generation
		}, 1},
		{"arm after expiry", func() uint64 {
			c.Advance(10 * time.Second)
			g, _ := l.Arm([]int{3}, 10*time.Second)
			return g[0].Generation
		}, 2},
		{"off keeps the generation", func() uint64 { g, _ := l.Off([]int{3}); return g[0].Generation }, 2},
		{"arm after off", func() uint64 { g, _ := l.Arm([]int{3}, time.Second); return g[0].Generation }, 3},
	}
	for _, s := range steps {
		if got := s.do(); got != s.wantGen {
			t.Fatalf("%s: generation = %d; want %d", s.name, got, s.wantGen)
		}
	}
}

func TestArmSetsDeadlineFromClock(t *testing.T) {
	c := clock.NewFake()
	l := New(c)
	g, err := l.Arm([]int{0, 1}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, gr := range g {
		if want := clock.Epoch.Add(30 * time.Second); !gr.Deadline.Equal(want) {
			t.Errorf("Arm(%d).Deadline = %v; want %v", gr.Shard, gr.Deadline, want)
		}
	}
	c.Advance(31 * time.Second)
	sum := l.Summarize([]int{0, 1, 2})
	if sum.Armed != 2 || sum.Expired != 2 || !sum.Deadline.IsZero() || sum.Generation != 1 {
		t.Fatalf("Summarize = %+v; want 2 armed, 2 expired, no live deadline, generation 1", sum)
	}
	g, _ = l.Off([]int{0})
	if !g[0].Deadline.IsZero() {
		t.Fatalf("Off: deadline = %v; want zero", g[0].Deadline)
	}
}
