package etcd

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
)

func genMembers(t *rapid.T, min, max int) []string {
	return rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z0-9-]{1,12}`), min, max, rapid.ID[string]).Draw(t, "members")
}

func TestOwnerDeterministicAndUnique(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		members := genMembers(t, 1, 12)
		total := rapid.IntRange(1, 512).Draw(t, "total")
		shuffled := slices.Clone(members)
		rapid.Permutation(shuffled).Draw(t, "order")
		seen := make([]int, total)
		for _, m := range members {
			for _, id := range Placement(m, members, total) {
				seen[id]++
			}
		}
		for id := 0; id < total; id++ {
			o := Owner(id, members)
			if !slices.Contains(members, o) {
				t.Fatalf("Owner(%d, %q) = %q; not a member", id, members, o)
			}
			if o2 := Owner(id, shuffled); o2 != o {
				t.Fatalf("Owner(%d) = %q for %q, %q for %q; want the same", id, o, members, o2, shuffled)
			}
			if seen[id] != 1 {
				t.Fatalf("shard %d placed on %d members; want exactly 1", id, seen[id])
			}
		}
	})
}

func TestOwnerRemoveMovesOnlyThatMembersShards(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		members := genMembers(t, 2, 12)
		gone := rapid.IntRange(0, len(members)-1).Draw(t, "gone")
		rest := slices.Delete(slices.Clone(members), gone, gone+1)
		for id := 0; id < 512; id++ {
			before, after := Owner(id, members), Owner(id, rest)
			if before != members[gone] && after != before {
				t.Fatalf("removing %q moved shard %d from %q to %q", members[gone], id, before, after)
			}
			if after == members[gone] {
				t.Fatalf("shard %d still on the removed member", id)
			}
		}
	})
}

func TestOwnerAddMovesItsShare(t *testing.T) {
	const total = 2048
	rapid.Check(t, func(t *rapid.T) {
		all := genMembers(t, 2, 10)
		n := len(all) - 1
		members, joiner := all[:n], all[n]
		moved := 0
		for id := 0; id < total; id++ {
			before, after := Owner(id, members), Owner(id, all)
			if before != after {
				if after != joiner {
					t.Fatalf("adding %q moved shard %d from %q to %q", joiner, id, before, after)
				}
				moved++
			}
		}
		// Expected total/(n+1); its standard deviation is below 23 here.
		want := float64(total) / float64(n+1)
		if f := float64(moved); f < 0.7*want || f > 1.3*want {
			t.Fatalf("adding a member to %d moved %d of %d shards; want about %.0f", n, moved, total, want)
		}
	})
}

func TestOwnerNoMembers(t *testing.T) {
	if got := Owner(3, nil); got != "" {
		t.Fatalf("Owner(3, nil) = %q; want \"\"", got)
	}
	if got := Placement("a", []string{"b"}, 8); got != nil {
		t.Fatalf("Placement of a non-member = %v; want nil", got)
	}
}

// TestOwnerStable pins the hash: nodes of different builds must agree, so
// a change of the weight function is a change of the placement contract.
// The values were computed by a separate Python implementation of FNV-1a
// 64 and fmix64.
func TestOwnerStable(t *testing.T) {
	if got, want := weight("node-a", 0), uint64(0x70412cd44f39e054); got != want {
		t.Fatalf("weight(node-a, 0) = %#x; want %#x", got, want)
	}
	members := []string{"node-a", "node-b", "node-c"}
	var got []string
	for id := 0; id < 8; id++ {
		got = append(got, Owner(id, members))
	}
	want := "[node-b node-a node-c node-c node-a node-a node-b node-b]"
	if fmt.Sprint(got) != want {
		t.Fatalf("placement of 0..7 over %v = %v; want %s", members, got, want)
	}
}

func TestMovePacer(t *testing.T) {
	c := clock.NewFake()
	p := NewMovePacer(c, 2)
	take := func(wantOK bool, wantWait time.Duration) {
		t.Helper()
		ok, wait := p.Take()
		if ok != wantOK || wait != wantWait {
			t.Fatalf("Take() at %v = %v, %v; want %v, %v", clock.Mono(c), ok, wait, wantOK, wantWait)
		}
	}
	take(true, 0)
	c.Advance(time.Second)
	take(true, 0)
	take(false, 4*time.Second)
	c.JumpWall(time.Hour) // a wall step must not free a slot
	take(false, 4*time.Second)
	c.Advance(4 * time.Second)
	take(true, 0)
	take(false, time.Second)
	c.Advance(time.Second)
	take(true, 0)
	take(false, 4*time.Second)
}

func TestMovePacerNeverExceeds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := clock.NewFake()
		max := rapid.IntRange(1, 16).Draw(t, "max")
		p := NewMovePacer(c, max)
		var starts []time.Duration
		for _, step := range rapid.SliceOfN(rapid.Int64Range(0, int64(3*time.Second)), 1, 200).Draw(t, "steps") {
			c.Advance(time.Duration(step))
			for {
				ok, wait := p.Take()
				if !ok {
					if wait <= 0 || wait > MoveWindow {
						t.Fatalf("Take() wait = %v; want in (0, %v]", wait, MoveWindow)
					}
					break
				}
				starts = append(starts, clock.Mono(c))
			}
		}
		for i := range starts {
			n := 0
			for _, s := range starts[i:] {
				if s-starts[i] < MoveWindow {
					n++
				}
			}
			if n > max {
				t.Fatalf("%d moves within %v of %v; want at most %d", n, MoveWindow, starts[i], max)
			}
		}
	})
}

// SetMax changes the moves per window at once, counting the moves already
// started: discovery raising max_concurrency from 1 to 3 after one move
// lets two more start in the same window.
func TestMovePacerSetMax(t *testing.T) {
	c := clock.NewFake()
	p := NewMovePacer(c, 1)
	if ok, _ := p.Take(); !ok {
		t.Fatal("first Take() refused")
	}
	if ok, wait := p.Take(); ok || wait != MoveWindow {
		t.Fatalf("Take() at max 1 = %v, %v; want false, %v", ok, wait, MoveWindow)
	}
	p.SetMax(3)
	for i := range 2 {
		if ok, wait := p.Take(); !ok {
			t.Fatalf("Take() %d after SetMax(3) = false, %v; want true", i, wait)
		}
	}
	if ok, wait := p.Take(); ok || wait != MoveWindow {
		t.Fatalf("fourth Take() in the window at max 3 = %v, %v; want false, %v", ok, wait, MoveWindow)
	}
	p.SetMax(0)
	c.Advance(MoveWindow)
	if ok, _ := p.Take(); !ok {
		t.Fatal("Take() after the window at SetMax(0) (taken as 1) refused")
	}
}
