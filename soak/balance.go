package soak

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Balance is the placement after a join or a leave, read from the watch of
// the shard keys once every member's count was within one of every
// other's (DESIGN 7.3: each of M members owns ⌊N/M⌋ or ⌈N/M⌉ of N shards
// when every member may own every shard, as in the soak), or when the
// soak gave up waiting.
type Balance struct {
	Fault int
	Kind  Kind
	// Change is "leave" (the fault took a node away), "join" (its
	// repair brought it back) or "etcd" (the end of an etcd fault, in
	// which no member should have come or gone).
	Change   string
	Members  int // M
	Min, Max int // shards of the least and the most loaded member
	// Moves counts the shards that changed hands from the change until
	// the placement was balanced: acquisitions of a key by a node other
	// than its previous holder.
	Moves    int
	Balanced bool          // within one, every shard owned by a member
	Took     time.Duration // from the change until balanced (or given up)
}

// MoveBound is ⌈N/M⌉ + 1, the most a join or a leave may move (DESIGN 7.3).
func (b Balance) MoveBound(shards int) int { return (shards+b.Members-1)/b.Members + 1 }

// placed returns each member's number of shards, and the shards held by no
// member (or by a node outside members).
func placed(owner []string, members []string) (loads map[string]int, stray int) {
	loads = map[string]int{}
	for _, m := range members {
		loads[m] = 0
	}
	for _, o := range owner {
		if _, ok := loads[o]; ok {
			loads[o]++
		} else {
			stray++
		}
	}
	return loads, stray
}

// spread is the least and the most of loads.
func spread(loads map[string]int) (lo, hi int) {
	first := true
	for _, n := range loads {
		if first || n < lo {
			lo = n
		}
		if first || n > hi {
			hi = n
		}
		first = false
	}
	return lo, hi
}

// awaitBalanced waits, at most d, until the watch shows every shard owned
// by one of members and each member within one shard of every other, and
// records the placement then (or when it gave up) with the moves since
// the change at since.
func (c *cluster) awaitBalanced(ctx context.Context, rep *Report, f fault, change string, members []string, since time.Time, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		owner := c.owners.current(c.cfg.Shards)
		loads, stray := placed(owner, members)
		lo, hi := spread(loads)
		ok := stray == 0 && hi-lo <= 1
		if ok || time.Now().After(deadline) || ctx.Err() != nil {
			b := Balance{Fault: f.n, Kind: f.kind, Change: change, Members: len(members), Min: lo, Max: hi,
				Moves: c.owners.movesSince(since), Balanced: ok, Took: time.Since(since)}
			rep.Placements = append(rep.Placements, b)
			if !ok {
				rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d (%s %s): placement after the %s not balanced within %v: %v, %d shards on no member", f.n, f.kind, f.node.Name, change, d, loads, stray))
			}
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// without returns names without name.
func without(names []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == name })
}
