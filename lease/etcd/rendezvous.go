package etcd

import (
	"slices"
	"strconv"
)

// Owner returns the member that rendezvous (highest-random-weight) hashing
// ranks first for shard, or "" when members is empty. The weight of a
// member is a hash of "node/shard", so the answer depends only on the set
// of names. Place uses it to break ties; alone it is uneven (three
// members of 8 shards may get 0, 4 and 4).
func Owner(shard int, members []string) string {
	best, bestW := "", uint64(0)
	for _, m := range members {
		w := weight(m, shard)
		if best == "" || w > bestW || (w == bestW && m < best) {
			best, bestW = m, w
		}
	}
	return best
}

// Candidate is a live member and the shards it may own (its --shards);
// nil Shards means every shard of the plan.
type Candidate struct {
	Node   string
	Shards []int
}

// Placement returns the shards of [0,total) that Place puts on node when
// every member may own every shard and no key is held yet (a fleet that
// starts at once), ascending.
func Placement(node string, members []string, total int) []int {
	if !slices.Contains(members, node) {
		return nil
	}
	cands := make([]Candidate, len(members))
	for i, m := range members {
		cands[i] = Candidate{Node: m}
	}
	var out []int
	for id, o := range Place(cands, total, nil) {
		if o == node {
			out = append(out, id)
		}
	}
	return out
}

// Place returns the owner of each shard of [0,total), "" for a shard no
// member may own. held[id] names the node whose key holds shard id now
// ("" or a node that is not in members for none; held may be nil).
//
// The placement is balanced over the candidates: a held shard stays with
// its holder, a free one goes to its least loaded candidate (ties to the
// rendezvous winner), and then, while some member owns at least two more
// than another it could hand a shard to (directly, or along a chain of
// members each taking one of the previous one's shards), the most loaded
// member gives one away along the shortest such chain. When every member
// may own every shard each owns ⌊N/M⌋ or ⌈N/M⌉; with narrower candidates
// no shard a member may own is held by one that owns two more.
//
// Keeping held shards where they are is what bounds the churn: a leave
// moves only the leaver's shards, a join only the joiner's share (at most
// ⌈N/M⌉). Every node that reads the members and the shard keys at one
// revision computes the same placement.
func Place(members []Candidate, total int, held []string) []string {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Candidate) int {
		switch {
		case a.Node < b.Node:
			return -1
		case a.Node > b.Node:
			return 1
		}
		return 0
	})
	ms = slices.CompactFunc(ms, func(a, b Candidate) bool { return a.Node == b.Node })
	may := make([][]bool, len(ms)) // nil row: every shard
	index := make(map[string]int, len(ms))
	for i, c := range ms {
		index[c.Node] = i
		if c.Shards != nil {
			may[i] = make([]bool, total)
			for _, id := range c.Shards {
				if id >= 0 && id < total {
					may[i][id] = true
				}
			}
		}
	}
	mayOwn := func(i, id int) bool { return may[i] == nil || may[i][id] }

	owner := make([]int, total)
	load := make([]int, len(ms))
	fresh := make([]bool, total)
	for id := range owner {
		owner[id] = -1
		if id < len(held) {
			if i, ok := index[held[id]]; ok && mayOwn(i, id) {
				owner[id] = i
				load[i]++
			}
		}
	}
	for id := range owner {
		if owner[id] >= 0 {
			continue
		}
		fresh[id] = true
		best, bestW := -1, uint64(0)
		for i := range ms {
			if !mayOwn(i, id) {
				continue
			}
			w := weight(ms[i].Node, id)
			if best < 0 || load[i] < load[best] || (load[i] == load[best] && w > bestW) {
				best, bestW = i, w
			}
		}
		if best >= 0 {
			owner[id] = best
			load[best]++
		}
	}
	for rebalance(ms, owner, load, fresh, mayOwn) {
	}

	out := make([]string, total)
	for id, i := range owner {
		if i >= 0 {
			out[id] = ms[i].Node
		}
	}
	return out
}

// rebalance moves one shard's worth of load from the most loaded member
// that can shed one to a member owning at least two fewer that it reaches,
// and reports whether it did. fresh[id] marks a shard no key held: moving
// it costs nothing, so chains prefer it, and among the members a chain
// reaches the cheapest (fewest held shards moved), then the least loaded,
// wins.
func rebalance(ms []Candidate, owner, load []int, fresh []bool, mayOwn func(i, id int) bool) bool {
	if len(ms) < 2 || slices.Max(load)-slices.Min(load) < 2 {
		return false
	}
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return load[b] - load[a] })
	low := slices.Min(load)
	type step struct{ from, shard int }
	for _, y := range order {
		if load[y]-low < 2 {
			return false
		}
		// 0-1 breadth first from y: cost[z] is the held shards moved to
		// give z one; via[z] is the shard z takes and from whom.
		cost := make([]int, len(ms))
		for i := range cost {
			cost[i] = -1
		}
		via := make([]step, len(ms))
		done := make([]bool, len(ms))
		cost[y] = 0
		deque := []int{y}
		for len(deque) > 0 {
			x := deque[0]
			deque = deque[1:]
			if done[x] {
				continue
			}
			done[x] = true
			best := make([]int, len(ms))
			for i := range best {
				best[i] = -1
			}
			better := func(z, id int) bool {
				b := best[z]
				if b < 0 || fresh[id] != fresh[b] {
					return b < 0 || fresh[id]
				}
				// The shard that ranks the taker highest: the one
				// rendezvous would sooner give it.
				return weight(ms[z].Node, id) > weight(ms[z].Node, b)
			}
			for id, o := range owner {
				if o != x {
					continue
				}
				for z := range ms {
					if !done[z] && mayOwn(z, id) && better(z, id) {
						best[z] = id
					}
				}
			}
			for z, id := range best {
				if id < 0 {
					continue
				}
				c := cost[x]
				if !fresh[id] {
					c++
				}
				if cost[z] < 0 || c < cost[z] {
					cost[z], via[z] = c, step{x, id}
					if c == cost[x] {
						deque = append([]int{z}, deque...)
					} else {
						deque = append(deque, z)
					}
				}
			}
		}
		target := -1
		for z := range ms {
			if z == y || cost[z] < 0 || load[z] > load[y]-2 {
				continue
			}
			if target < 0 || cost[z] < cost[target] || (cost[z] == cost[target] && load[z] < load[target]) {
				target = z
			}
		}
		if target < 0 {
			continue
		}
		if via[target].from == y {
			// A direct hand-over moves a batch at once, as many as takes y
			// down to, or target up to, an even share (at least one, at
			// most half the difference): one shard per call would cost a
			// search per shard when a node joins a fleet of thousands.
			lo, hi := evenShare(load)
			k := max(1, min(load[y]-hi, lo-load[target]))
			k = min(k, (load[y]-load[target])/2)
			var give []int
			for id, o := range owner {
				if o == y && mayOwn(target, id) {
					give = append(give, id)
				}
			}
			slices.SortFunc(give, func(a, b int) int {
				if fresh[a] != fresh[b] {
					if fresh[a] {
						return -1
					}
					return 1
				}
				wa, wb := weight(ms[target].Node, a), weight(ms[target].Node, b)
				switch {
				case wa > wb:
					return -1
				case wa < wb:
					return 1
				}
				return a - b
			})
			for _, id := range give[:min(k, len(give))] {
				owner[id] = target
				fresh[id] = false
				load[y]--
				load[target]++
			}
			return true
		}
		for z := target; z != y; z = via[z].from {
			id := via[z].shard
			owner[id] = z
			fresh[id] = false
		}
		load[y]--
		load[target]++
		return true
	}
	return false
}

// evenShare is ⌊N/M⌋ and ⌈N/M⌉ of the shards placed over the members.
func evenShare(load []int) (lo, hi int) {
	n := 0
	for _, l := range load {
		n += l
	}
	return n / len(load), (n + len(load) - 1) / len(load)
}

// weight is FNV-1a 64 of node+"/"+shard, finished with the murmur3 fmix64
// mixer: FNV alone spreads names that differ in their last bytes poorly
// (shard ids do), and a skewed weight would skew the placement.
func weight(node string, shard int) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(node); i++ {
		h = (h ^ uint64(node[i])) * prime
	}
	h = (h ^ '/') * prime
	var buf [20]byte
	for _, c := range strconv.AppendInt(buf[:0], int64(shard), 10) {
		h = (h ^ uint64(c)) * prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
