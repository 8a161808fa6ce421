package main

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// hist is a log-linear histogram of durations: 32 sub-buckets per power of
// two, so a quantile is within about 2% of the true value. Record is
// lock-free.
type hist struct {
	counts [64 * subBuckets]atomic.Uint64
	n      atomic.Uint64
	max    atomic.Int64
}

const subBits = 5
const subBuckets = 1 << subBits

func bucketOf(ns uint64) int {
	if ns < subBuckets {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // ns in [2^e, 2^(e+1))
	sub := (ns >> (e - subBits)) & (subBuckets - 1)
	return (e-subBits+1)*subBuckets + int(sub)
}

// bucketMid is a representative value of bucket i: its midpoint.
func bucketMid(i int) float64 {
	if i < subBuckets {
		return float64(i)
	}
	e := i/subBuckets + subBits - 1
	sub := uint64(i % subBuckets)
	lo := (uint64(1) << e) | sub<<(e-subBits)
	width := uint64(1) << (e - subBits)
	return float64(lo) + float64(width)/2
}

func (h *hist) record(d time.Duration) {
	ns := uint64(max(d, 0))
	h.counts[bucketOf(ns)].Add(1)
	h.n.Add(1)
	for {
		m := h.max.Load()
		if int64(ns) <= m || h.max.CompareAndSwap(m, int64(ns)) {
			return
		}
	}
}

func (h *hist) reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.n.Store(0)
	h.max.Store(0)
}

// quantile returns the q-quantile (0 < q ≤ 1) in nanoseconds.
func (h *hist) quantile(q float64) float64 {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.5)
	rank = min(max(rank, 1), n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return bucketMid(i)
		}
	}
	return float64(h.max.Load())
}
