// Package moveset is a set of states, one bit each, for the tables that
// list where each state of a state machine may move (the core's
// lifecycle, a gateway connection's phases, a reshard move).
package moveset

import (
	"fmt"
	"math/bits"
)

// State is what a table's states must be: small integers (below 64) that
// print their own names.
type State interface {
	~uint8 | ~uint16 | ~uint32
	fmt.Stringer
}

// Set is a set of states of type S.
type Set[S State] uint64

// Of is the set of the states ss.
func Of[S State](ss ...S) Set[S] {
	var set Set[S]
	for _, s := range ss {
		set |= 1 << s
	}
	return set
}

// Has reports whether s is in the set.
func (set Set[S]) Has(s S) bool { return uint64(s) < 64 && set&(1<<s) != 0 }

// String lists the set's states by name, in their order: {READY BACKOFF}.
func (set Set[S]) String() string {
	out := "{"
	for x := uint64(set); x != 0; x &= x - 1 {
		if len(out) > 1 {
			out += " "
		}
		out += S(bits.TrailingZeros64(x)).String()
	}
	return out + "}"
}
