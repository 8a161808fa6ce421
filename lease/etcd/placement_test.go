package etcd

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func loads(place []string) map[string]int {
	n := map[string]int{}
	for _, o := range place {
		if o != "" {
			n[o]++
		}
	}
	return n
}

func sortedLoads(place []string, members []Candidate) []int {
	n := loads(place)
	var out []int
	for _, c := range members {
		out = append(out, n[c.Node])
	}
	slices.Sort(out)
	return out
}

// The reproductions of issue 22 item 3: rendezvous alone left shards 1, 2,
// 6 and 7 unowned with a = 0-3 and b = 4-7, and placed 0/4/4 (8 shards)
// and 2/6/8 (16 shards) on n1, n2, n3.
func TestPlaceReproductions(t *testing.T) {
	split := Place([]Candidate{{"a", []int{0, 1, 2, 3}}, {"b", []int{4, 5, 6, 7}}}, 8, nil)
	for id, o := range split {
		if want := map[bool]string{true: "a", false: "b"}[id < 4]; o != want {
			t.Errorf("Place(a=0-3, b=4-7) shard %d = %q; want %q", id, o, want)
		}
	}
	three := []Candidate{{Node: "n1"}, {Node: "n2"}, {Node: "n3"}}
	for total, want := range map[int][]int{8: {2, 3, 3}, 16: {5, 5, 6}} {
		if got := sortedLoads(Place(three, total, nil), three); !slices.Equal(got, want) {
			t.Errorf("Place(n1 n2 n3, %d) loads = %v; want %v", total, got, want)
		}
	}
}

func genCandidates(t *rapid.T, total int, narrow bool) []Candidate {
	names := genMembers(t, 1, 8)
	out := make([]Candidate, len(names))
	for i, n := range names {
		out[i].Node = n
		if narrow && rapid.Bool().Draw(t, "narrow "+n) {
			out[i].Shards = rapid.SliceOfDistinct(rapid.IntRange(0, total-1), rapid.ID[int]).Draw(t, "shards "+n)
		}
	}
	return out
}

// checkPlace checks what Place promises of one placement: every shard some
// member may own is owned by one that may, none other is; with full
// candidates each member owns ⌊N/M⌋ or ⌈N/M⌉; and no member could take a
// shard from one that owns two more than it.
func checkPlace(t *rapid.T, members []Candidate, total int, place []string) {
	mayOwn := func(c Candidate, id int) bool { return c.Shards == nil || slices.Contains(c.Shards, id) }
	byName := map[string]Candidate{}
	for _, c := range members {
		byName[c.Node] = c
	}
	n := loads(place)
	full := true
	for _, c := range members {
		full = full && c.Shards == nil
	}
	for id, o := range place {
		anyMay := slices.ContainsFunc(members, func(c Candidate) bool { return mayOwn(c, id) })
		c, ok := byName[o]
		switch {
		case o == "" && anyMay:
			t.Fatalf("shard %d unowned; some member may own it (%v)", id, members)
		case o != "" && (!ok || !mayOwn(c, id)):
			t.Fatalf("shard %d placed on %q, which may not own it", id, o)
		}
		for _, z := range members {
			if o != "" && mayOwn(z, id) && n[z.Node] < n[o]-1 {
				t.Fatalf("shard %d on %s (owns %d) while %s (owns %d) may own it", id, o, n[o], z.Node, n[z.Node])
			}
		}
	}
	if full {
		lo, hi := total/len(members), (total+len(members)-1)/len(members)
		for _, c := range members {
			if l := n[c.Node]; l < lo || l > hi {
				t.Fatalf("%s owns %d of %d over %d members; want %d or %d", c.Node, l, total, len(members), lo, hi)
			}
		}
	}
}

func TestPlaceBalancedOverCandidates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.IntRange(1, 200).Draw(t, "total")
		members := genCandidates(t, total, true)
		place := Place(members, total, nil)
		checkPlace(t, members, total, place)
		shuffled := slices.Clone(members)
		rapid.Permutation(shuffled).Draw(t, "order")
		if again := Place(shuffled, total, nil); !slices.Equal(again, place) {
			t.Fatalf("Place depends on the order of the members: %v, then %v", place, again)
		}
	})
}

// moved counts the shards that change owner; a shard nobody could own
// before, or can own after, does not move.
func moved(before, after []string) int {
	n := 0
	for id := range before {
		if before[id] != "" && after[id] != "" && before[id] != after[id] {
			n++
		}
	}
	return n
}

// A sequence of joins and leaves, each placed from the keys the last
// placement left held: every step keeps Place's promises and moves at most
// ⌈N/M⌉ + 1 shards (M the larger member count of the two) when every
// member may own every shard.
func TestPlaceChurnBounded(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.IntRange(1, 300).Draw(t, "total")
		narrow := rapid.Bool().Draw(t, "narrow")
		pool := genCandidates(t, total, narrow)
		live := []Candidate{pool[0]}
		place := Place(live, total, nil)
		for step := range rapid.IntRange(1, 12).Draw(t, "steps") {
			c := pool[rapid.IntRange(0, len(pool)-1).Draw(t, fmt.Sprint("who ", step))]
			next := slices.DeleteFunc(slices.Clone(live), func(x Candidate) bool { return x.Node == c.Node })
			if len(next) == len(live) {
				next = append(next, c)
			}
			if len(next) == 0 {
				continue
			}
			after := Place(next, total, place)
			checkPlace(t, next, total, after)
			// Narrow candidates can force a chain: a = 0-5, c = all of 12,
			// then b = 6-9 joins: b takes 4 from c, which must take 2 from
			// a to stay balanced, 6 moves. The bound is for full sets.
			m := max(len(live), len(next))
			if mv, bound := moved(place, after), (total+m-1)/m+1; !narrow && mv > bound {
				t.Fatalf("%v → %v moved %d of %d shards; want at most %d", live, next, mv, total, bound)
			}
			live, place = next, after
		}
	})
}
