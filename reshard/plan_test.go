package reshard_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/reshard"
)

// TestSplitCarryTheirGuilds: every guild of old shard k lands, in
// the plan of M×N, on one of Split(k, N, M×N), and those shards
// carry no guild of another old shard.
func TestSplitCarryTheirGuilds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 2048).Draw(rt, "N")
		m := rapid.IntRange(1, 16).Draw(rt, "M")
		k := rapid.IntRange(0, n-1).Draw(rt, "k")
		children, err := reshard.Split(k, n, m*n)
		if err != nil {
			rt.Fatalf("Split(%d, %d, %d) = %v", k, n, m*n, err)
		}
		if len(children) != m {
			rt.Fatalf("Split(%d, %d, %d) has %d shards; want %d", k, n, m*n, len(children), m)
		}
		for i, c := range children {
			if c != k+i*n {
				rt.Fatalf("Split(%d, %d, %d)[%d] = %d; want %d", k, n, m*n, i, c, k+i*n)
			}
		}
		g := rapid.Uint64().Draw(rt, "guild")
		before, after := reshard.ShardOf(g, n), reshard.ShardOf(g, m*n)
		owns := false
		for _, c := range children {
			owns = owns || c == after
		}
		if (before == k) != owns {
			rt.Fatalf("guild %d: shard %d of %d, shard %d of %d; children of %d are %v", g, before, n, after, m*n, k, children)
		}
	})
}

func TestSplitRefuses(t *testing.T) {
	for _, c := range []struct{ k, old, new int }{
		{0, 0, 4}, {0, 4, 0}, {-1, 4, 8}, {4, 4, 8}, {1, 4, 6},
	} {
		if got, err := reshard.Split(c.k, c.old, c.new); err == nil {
			t.Errorf("Split(%d, %d, %d) = %v; want an error", c.k, c.old, c.new, got)
		}
	}
}

func TestNextTotal(t *testing.T) {
	for _, c := range []struct {
		name                     string
		flavor                   core.Flavor
		current, answer, maxConc int
		want                     int
		wantErr                  string
	}{
		{"discord doubles", core.Discord, 16, 32, 1, 32, ""},
		{"rounded up to max_concurrency", core.Discord, 16, 33, 16, 48, ""},
		{"already a multiple", core.Discord, 256, 512, 16, 512, ""},
		{"zero shards", core.Discord, 4, 0, 1, 0, "answered 0 shards"},
		{"fewer than now", core.Discord, 16, 8, 1, 0, "not more than the current 16"},
		{"as many as now", core.Discord, 16, 16, 1, 0, "not more than the current 16"},
		{"beyond the ceiling", core.Discord, 16, 16385, 1, 0, "beyond the ceiling of 16384"},
		{"rounding crosses the ceiling", core.Discord, 16, 16380, 16, 16384, ""},
		{"at the ceiling", core.Discord, 16384, 32768, 1, 0, "already has 16384"},
		{"fluxer communities", core.Fluxer, 1, 5001, 1, 3, ""},
		{"fluxer exactly", core.Fluxer, 2, 6000, 1, 3, ""},
		{"fluxer none", core.Fluxer, 1, 0, 1, 0, "answered 0 shards"},
		{"fluxer negative", core.Fluxer, 1, -1, 1, 0, "community count of -1"},
		{"fluxer ignores max_concurrency", core.Fluxer, 1, 4001, 16, 3, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := reshard.NextTotal(c.flavor, c.current, c.answer, c.maxConc)
			if c.wantErr == "" {
				if err != nil || got != c.want {
					t.Fatalf("NextTotal(%v, %d, %d, %d) = %d, %v; want %d", c.flavor, c.current, c.answer, c.maxConc, got, err, c.want)
				}
				return
			}
			if err == nil || !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("NextTotal(%v, %d, %d, %d) = %d, %v; want an ErrReshard saying %q", c.flavor, c.current, c.answer, c.maxConc, got, err, c.wantErr)
			}
		})
	}
}

func TestCheckBudget(t *testing.T) {
	if err := reshard.CheckBudget(32, 42, 10); err != nil {
		t.Errorf("CheckBudget(32, 42, 10) = %v; want nil (exactly the budget above the reserve)", err)
	}
	err := reshard.CheckBudget(32, 41, 10)
	if !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "needs 32 identifies and the budget has 31 left above its reserve of 10") {
		t.Errorf("CheckBudget(32, 41, 10) = %v; want a refusal naming 32, 31 and 10", err)
	}
	if err := reshard.CheckBudget(1, 5, 10); err == nil || !strings.Contains(err.Error(), "has 0 left") {
		t.Errorf("CheckBudget(1, 5, 10) = %v; want a refusal with 0 left", err)
	}
}

func TestLimiterRollingHour(t *testing.T) {
	c := clock.NewFake()
	l := reshard.NewLimiter(c)
	for i := range reshard.MovesPerHour {
		if err := l.Admit(); err != nil {
			t.Fatalf("move %d: Admit = %v; want nil", i+1, err)
		}
		c.Advance(10 * time.Minute)
	}
	// 30 min after the first move: the fourth is refused, and a wall
	// clock step back by two hours changes nothing.
	c.JumpWall(-2 * time.Hour)
	err := l.Admit()
	if !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "3 moves in the last hour") {
		t.Fatalf("fourth move within the hour: Admit = %v; want a refusal", err)
	}
	c.Advance(30*time.Minute - time.Nanosecond)
	if err := l.Admit(); err == nil {
		t.Fatal("a nanosecond before the first move leaves the hour: Admit = nil; want a refusal")
	}
	c.Advance(time.Nanosecond)
	if err := l.Admit(); err != nil {
		t.Fatalf("an hour after the first move: Admit = %v; want nil", err)
	}
}

// Check refuses as Admit would and records nothing: a refused write does
// not use up one of the hour's moves, nor does an accepted check.
func TestLimiterCheckRecordsNothing(t *testing.T) {
	c := clock.NewFake()
	l := reshard.NewLimiter(c)
	for range 2 * reshard.MovesPerHour {
		if err := l.Check(); err != nil {
			t.Fatalf("Check with no move = %v; want nil", err)
		}
	}
	for i := range reshard.MovesPerHour {
		if err := l.Admit(); err != nil {
			t.Fatalf("move %d: Admit = %v; want nil", i+1, err)
		}
	}
	err := l.Check()
	if !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "3 moves in the last hour") {
		t.Fatalf("Check after 3 moves = %v; want the refusal Admit gives", err)
	}
	c.Advance(time.Hour)
	if err := l.Check(); err != nil {
		t.Fatalf("Check an hour later = %v; want nil", err)
	}
}
