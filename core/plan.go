package core

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxTotal bounds the global shard count a plan may name. Discord's largest
// bots run tens of thousands of shards; a million leaves room and still
// catches a typo.
const MaxTotal = 1 << 20

// Plan says which shards this node runs: Local holds shard IDs of a bot
// sharded Total ways. The two are independent: a node may run 64 shards of
// a 16,384 total.
type Plan struct {
	Total int
	Local []int
}

// PlanUsage says what a valid plan is, for error messages.
const PlanUsage = "usage: a total of 1 to 1048576 shards and distinct local shard IDs below it, e.g. total 16 with shards 0-3,7"

// Validate checks that the plan names at least one shard, no shard twice,
// and none outside [0, Total). Errors name the offending value and carry
// PlanUsage.
func (p Plan) Validate() error {
	bad := func(is error, format string, args ...any) error {
		return fmt.Errorf("%w: %s; %s", is, fmt.Sprintf(format, args...), PlanUsage)
	}
	if p.Total < 1 || p.Total > MaxTotal {
		return bad(ErrUsage, "total %d is outside 1..%d", p.Total, MaxTotal)
	}
	if len(p.Local) == 0 {
		return bad(ErrUsage, "the plan has no local shards")
	}
	if len(p.Local) > p.Total {
		return bad(ErrUsage, "%d local shards exceed the total of %d", len(p.Local), p.Total)
	}
	seen := make(map[int]struct{}, len(p.Local))
	for _, id := range p.Local {
		if id < 0 || id >= p.Total {
			return bad(ErrUnknownShard, "shard %d is outside 0..%d", id, p.Total-1)
		}
		if _, dup := seen[id]; dup {
			return bad(ErrUsage, "shard %d is named twice", id)
		}
		seen[id] = struct{}{}
	}
	return nil
}

// ParseShardList reads a list such as "0-3,7" (commas or spaces between
// items, inclusive ranges). It checks only the syntax; Plan.Validate checks
// the IDs against a total.
func ParseShardList(s string) ([]int, error) {
	var ids []int
	for _, item := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := parseShardID(lo)
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not a shard ID or range", ErrUsage, item)
		}
		b := a
		if isRange {
			if b, err = parseShardID(hi); err != nil || b < a {
				return nil, fmt.Errorf("%w: %q is not a shard ID or range", ErrUsage, item)
			}
		}
		if b-a >= MaxTotal || len(ids)+b-a >= MaxTotal {
			return nil, fmt.Errorf("%w: %q names more than %d shards", ErrUsage, item, MaxTotal)
		}
		for id := a; id <= b; id++ {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: empty shard list", ErrUsage)
	}
	return ids, nil
}

func parseShardID(s string) (int, error) {
	if s == "" || len(s) > 7 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	return strconv.Atoi(s)
}

// Range returns the plan of shards [lo, hi] of total. It builds no list
// for a total Validate would refuse anyway.
func Range(total, lo, hi int) Plan {
	p := Plan{Total: total}
	if total > MaxTotal || hi-lo >= MaxTotal {
		return p
	}
	for id := lo; id <= hi; id++ {
		p.Local = append(p.Local, id)
	}
	return p
}

func (p Plan) sorted() []int {
	ids := slices.Clone(p.Local)
	slices.Sort(ids)
	return ids
}
