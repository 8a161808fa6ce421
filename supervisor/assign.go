package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/shardfs"
)

// MaxIDLen bounds a child's id: it is shown in /children, in log labels
// and in folder names.
const MaxIDLen = 128

// ErrAssignment is wrapped by every error about an assignment.
var ErrAssignment = errors.New("bad assignment")

// Block is one child's share of the plan.
type Block struct {
	// ID names the child in /children, on /ctl and in its log label.
	ID string
	// Shards are the shard IDs the child owns, ascending.
	Shards []int
}

// Assignment divides a plan's shards among children.
type Assignment struct {
	Total  int
	Blocks []Block
	// Unowned are the shards of the total no child owns, ascending. An
	// --assign may leave gaps (another machine may own them); they are
	// reported, not refused.
	Unowned []int
}

// Owner returns the index of the block that owns shard, or -1.
func (a Assignment) Owner(shard int) int {
	for i, b := range a.Blocks {
		if _, ok := slices.BinarySearch(b.Shards, shard); ok {
			return i
		}
	}
	return -1
}

// ByProcesses splits shards 0..total-1 into n contiguous blocks whose sizes
// differ by at most one, the larger first. The children are named c0, c1, ...
func ByProcesses(total, n int) (Assignment, error) {
	if err := checkTotal(total); err != nil {
		return Assignment{}, err
	}
	if n < 1 {
		return Assignment{}, fmt.Errorf("%w: --processes %d: want at least 1", ErrAssignment, n)
	}
	if n > total {
		return Assignment{}, fmt.Errorf("%w: --processes %d is larger than the total of %d shards: a child would own none", ErrAssignment, n, total)
	}
	a := Assignment{Total: total}
	lo := 0
	for i := range n {
		size := total / n
		if i < total%n {
			size++
		}
		a.Blocks = append(a.Blocks, Block{ID: "c" + strconv.Itoa(i), Shards: span(lo, lo+size-1)})
		lo += size
	}
	return a, nil
}

// ByShardsPerProcess splits shards 0..total-1 into blocks of k (the last
// may be smaller), named c0, c1, ...
func ByShardsPerProcess(total, k int) (Assignment, error) {
	if err := checkTotal(total); err != nil {
		return Assignment{}, err
	}
	if k < 1 {
		return Assignment{}, fmt.Errorf("%w: --shards-per-process %d: want at least 1", ErrAssignment, k)
	}
	a := Assignment{Total: total}
	for lo, i := 0, 0; lo < total; lo, i = lo+k, i+1 {
		a.Blocks = append(a.Blocks, Block{ID: "c" + strconv.Itoa(i), Shards: span(lo, min(lo+k, total)-1)})
	}
	return a, nil
}

// ParseAssign parses --assign: blocks separated by ';', each ID=SHARDS
// where SHARDS is a shard list as --shards takes it ("0-3,7"). IDs are
// 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or
// '-', and distinct; no shard may be owned twice nor lie outside the
// total.
func ParseAssign(total int, spec string) (Assignment, error) {
	if err := checkTotal(total); err != nil {
		return Assignment{}, err
	}
	a := Assignment{Total: total}
	owner := map[int]string{}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(spec, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, list, ok := strings.Cut(item, "=")
		id = strings.TrimSpace(id)
		if !ok {
			return Assignment{}, fmt.Errorf("%w: %q: want ID=SHARDS, e.g. a=0-3", ErrAssignment, clip(item))
		}
		if err := checkID(id); err != nil {
			return Assignment{}, err
		}
		if seen[id] {
			return Assignment{}, fmt.Errorf("%w: child %q is named twice", ErrAssignment, id)
		}
		seen[id] = true
		ids, err := core.ParseShardList(list)
		if err != nil {
			return Assignment{}, fmt.Errorf("%w: child %q: %v", ErrAssignment, id, err)
		}
		slices.Sort(ids)
		for i, s := range ids {
			if s >= total {
				return Assignment{}, fmt.Errorf("%w: child %q: shard %d is outside the total of %d (0-%d)", ErrAssignment, id, s, total, total-1)
			}
			if i > 0 && ids[i-1] == s {
				return Assignment{}, fmt.Errorf("%w: child %q names shard %d twice", ErrAssignment, id, s)
			}
			if o, dup := owner[s]; dup {
				return Assignment{}, fmt.Errorf("%w: shard %d is assigned to both %q and %q", ErrAssignment, s, o, id)
			}
			owner[s] = id
		}
		a.Blocks = append(a.Blocks, Block{ID: id, Shards: ids})
	}
	if len(a.Blocks) == 0 {
		return Assignment{}, fmt.Errorf("%w: --assign %q names no child", ErrAssignment, clip(spec))
	}
	for s := range total {
		if _, ok := owner[s]; !ok {
			a.Unowned = append(a.Unowned, s)
		}
	}
	return a, nil
}

// FormatShards writes ids (ascending) as ranges: "0-3,7", as /plan and
// --shards do.
func FormatShards(ids []int) string { return shardfs.FormatShardList(ids) }

func checkTotal(total int) error {
	if total < 1 || total > core.MaxTotal {
		return fmt.Errorf("%w: total %d: want 1 to %d", ErrAssignment, total, core.MaxTotal)
	}
	return nil
}

func checkID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: a child has an empty ID", ErrAssignment)
	case len(id) > MaxIDLen:
		return fmt.Errorf("%w: child ID %q... is %d characters long, over %d", ErrAssignment, id[:16], len(id), MaxIDLen)
	case id[0] == '.' || id[0] == '-':
		return fmt.Errorf("%w: child ID %q starts with %q", ErrAssignment, id, id[0])
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%w: child ID %q: %q is not a letter, digit, '.', '_' or '-'", ErrAssignment, clip(id), r)
		}
	}
	return nil
}

func span(lo, hi int) []int {
	out := make([]int, 0, hi-lo+1)
	for i := lo; i <= hi; i++ {
		out = append(out, i)
	}
	return out
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
