package etcd

import (
	"slices"
	"strconv"
)

// Owner returns the member that rendezvous (highest-random-weight) hashing
// places shard on, or "" when members is empty. The weight of a member is
// a hash of "node/shard", so the answer depends only on the set of names:
// removing a member moves only its shards, adding one takes about
// 1/(n+1) of them, and every node computes the same placement.
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

// Placement returns the shards of [0,total) that Owner places on node,
// ascending.
func Placement(node string, members []string, total int) []int {
	if !slices.Contains(members, node) {
		return nil
	}
	var out []int
	for id := 0; id < total; id++ {
		if Owner(id, members) == node {
			out = append(out, id)
		}
	}
	return out
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
