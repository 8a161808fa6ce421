package etcd

import (
	"errors"
	"slices"
	"testing"
)

func FuzzDecodePlan(f *testing.F) {
	for _, s := range []string{`{"flavor":"discord","total":16}`, `{"flavor":"fluxer","total":1}`, `nonsense`, `{"total":3}`, `{"flavor":"x","total":2}{}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		p, err := decodePlan("/shardfs/b/plan", v)
		if err != nil {
			if !errors.Is(err, ErrBadPlan) {
				t.Fatalf("decodePlan(%q) = %v; want ErrBadPlan", v, err)
			}
			return
		}
		if p.Flavor == "" || p.Total < 1 {
			t.Fatalf("decodePlan(%q) accepted %+v", v, p)
		}
		q, err := decodePlan("/shardfs/b/plan", []byte(p.encode()))
		if err != nil || q != p {
			t.Fatalf("round trip of %+v = %+v, %v", p, q, err)
		}
	})
}

func TestParseShard(t *testing.T) {
	for _, c := range []struct {
		s  string
		id int
		ok bool
	}{
		{"0", 0, true}, {"15", 15, true}, {"16", 0, false}, {"007", 0, false}, {"-1", 0, false},
		{"+1", 0, false}, {"", 0, false}, {"1a", 0, false}, {"9999999999", 0, false},
	} {
		id, ok := parseShard(c.s, 16)
		if ok != c.ok || (ok && id != c.id) {
			t.Errorf("parseShard(%q, 16) = %d, %v; want %d, %v", c.s, id, ok, c.id, c.ok)
		}
	}
}

// BenchmarkPlacement16384 is the cost of a node recomputing its share of a
// 16,384-shard plan over 8 members, as it does when membership changes.
func BenchmarkPlacement16384(b *testing.B) {
	members := []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"}
	for b.Loop() {
		if len(Placement("n3", members, 16384)) == 0 {
			b.Fatal("no shards placed on n3")
		}
	}
}

func TestMemberValue(t *testing.T) {
	for _, c := range []struct {
		node  string
		cands []int
		value string
	}{
		{"a", nil, "a"},
		{"a", []int{7, 0, 1, 2, 3}, `{"node":"a","shards":"0-3,7"}`},
		{"a", []int{}, `{"node":"a"}`},
	} {
		v := encodeMember(c.node, c.cands)
		if v != c.value {
			t.Errorf("encodeMember(%q, %v) = %s; want %s", c.node, c.cands, v, c.value)
		}
		got, ok := decodeMember(c.node, []byte(v), 8)
		if want := slices.Sorted(slices.Values(c.cands)); !ok || got.Node != c.node || !slices.Equal(got.Shards, want) || (c.cands == nil) != (got.Shards == nil) {
			t.Errorf("decodeMember(%q, %s) = %+v, %v; want shards %v", c.node, v, got, ok, c.cands)
		}
	}
	for _, bad := range []string{"b", `{"node":"b"}`, `{"node":"a","shards":"9"}`, `{"node":"a","shards":"x"}`, `{"node":"a","x":1}`, `{"node":"a"} {}`} {
		if got, ok := decodeMember("a", []byte(bad), 8); ok {
			t.Errorf("decodeMember(a, %s) = %+v; want refused", bad, got)
		}
	}
}

// BenchmarkPlaceJoin16384 is a node joining a lone node that holds all of
// a 16,384-shard plan: the reconcile that computes the hand-over.
func BenchmarkPlaceJoin16384(b *testing.B) {
	held := make([]string, 16384)
	for id := range held {
		held[id] = "n1"
	}
	members := []Candidate{{Node: "n1"}, {Node: "n2"}}
	for b.Loop() {
		if n := loads(Place(members, 16384, held))["n2"]; n != 8192 {
			b.Fatalf("n2 placed %d; want 8192", n)
		}
	}
}
