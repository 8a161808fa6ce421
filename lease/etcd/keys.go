package etcd

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/shardfs/shardfs/core"
)

// Errors, wrapped with the details.
var (
	// ErrPlanMismatch: the plan key holds another flavor or total.
	ErrPlanMismatch = errors.New("plan mismatch")
	// ErrBadPlan: the plan key holds something that is not a plan.
	ErrBadPlan = errors.New("malformed plan key")
	// ErrBadName: a bot or node name cannot be a key segment.
	ErrBadName = errors.New("bad name")
	// ErrMemberExists: members/<node> is held by another lease.
	ErrMemberExists = errors.New("member already present")
	// ErrShardTaken: another member (or an earlier lease) holds the shard key.
	ErrShardTaken = errors.New("shard held by another owner")
	// ErrGeneration: the shard key was deleted or re-created since the
	// generation was taken; the write was not made.
	ErrGeneration = errors.New("shard generation no longer current")
	// ErrUnknownShard: the shard id is outside the plan.
	ErrUnknownShard = errors.New("shard not in the plan")
	// ErrLeaseLost: the self-fencing deadline passed without a renewal, or
	// etcd no longer knows the lease.
	ErrLeaseLost = errors.New("lease lost")
	// ErrClosed: Close was called.
	ErrClosed = errors.New("member closed")
)

// Prefix returns the folder of bot's keys.
func Prefix(bot string) string { return "/shardfs/" + bot + "/" }

// checkName accepts a bot or node name: a non-empty key segment of at most
// 128 printable characters without '/' or space, so that no name can
// reach into another bot's or node's keys.
func checkName(what, s string) error {
	if s == "" || len(s) > 128 || s == "." || s == ".." {
		return fmt.Errorf("%w: %s %q", ErrBadName, what, s)
	}
	for _, r := range s {
		if r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %s %q (no '/', spaces or control characters)", ErrBadName, what, s)
		}
	}
	return nil
}

// Plan is what every node of a bot must agree on.
type Plan struct {
	Flavor string `json:"flavor"`
	Total  int    `json:"total"`
}

func (p Plan) String() string { return fmt.Sprintf("flavor %s total %d", p.Flavor, p.Total) }

func (p Plan) check() error {
	if p.Flavor == "" || p.Total < 1 {
		return fmt.Errorf("%w: %s", ErrBadPlan, p)
	}
	return nil
}

func (p Plan) encode() string {
	b, _ := json.Marshal(p)
	return string(b)
}

// decodePlan parses the plan key's value strictly: an unknown field, a
// missing flavor or a total below 1 is garbage, not a plan.
func decodePlan(key string, v []byte) (Plan, error) {
	var p Plan
	d := json.NewDecoder(strings.NewReader(string(v)))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil || d.More() || p.check() != nil {
		return Plan{}, fmt.Errorf("%w: %s holds %s, want {\"flavor\":NAME,\"total\":N}", ErrBadPlan, key, quote(v))
	}
	return p, nil
}

// quote shows at most 64 bytes of a key's value in an error or log line.
func quote(v []byte) string {
	if len(v) > 64 {
		return strconv.Quote(string(v[:64])) + "..."
	}
	return strconv.Quote(string(v))
}

// clip shows at most 64 bytes of a key's value in a log line.
func clip(v []byte) string {
	if len(v) > 64 {
		return string(v[:64]) + "..."
	}
	return string(v)
}

// parseShard parses the id of a shards/<id> key: decimal, no sign, no
// leading zero, so that each shard has exactly one key.
func parseShard(s string, total int) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	id, _ := strconv.Atoi(s)
	return id, id < total
}

// memberValue is the value of members/<node>: the node's name and, when it
// may own only some shards (--shards), those as ranges ("0-3,7"), so that
// every node places the shards over every node's candidates.
type memberValue struct {
	Node   string `json:"node"`
	Shards string `json:"shards,omitempty"`
}

// encodeMember is the value of members/<node>; a node that may own every
// shard writes its bare name, as before candidates were published.
func encodeMember(node string, candidates []int) string {
	if candidates == nil {
		return node
	}
	b, _ := json.Marshal(memberValue{Node: node, Shards: formatRanges(candidates)})
	return string(b)
}

// decodeMember reads the value of members/<name>: the bare name (every
// shard) or the JSON of memberValue naming the same node. A candidate
// list that does not parse, or names a shard outside the plan, is no
// member value.
func decodeMember(name string, v []byte, total int) (Candidate, bool) {
	if string(v) == name {
		return Candidate{Node: name}, true
	}
	var mv memberValue
	d := json.NewDecoder(strings.NewReader(string(v)))
	d.DisallowUnknownFields()
	if err := d.Decode(&mv); err != nil || d.More() || mv.Node != name {
		return Candidate{}, false
	}
	c := Candidate{Node: name, Shards: []int{}}
	if mv.Shards == "" {
		return c, true
	}
	ids, err := core.ParseShardList(mv.Shards)
	if err != nil {
		return Candidate{}, false
	}
	for _, id := range ids {
		if id < 0 || id >= total {
			return Candidate{}, false
		}
	}
	c.Shards = ids
	return c, true
}

// formatRanges writes ids as ranges, "0-3,7", ascending.
func formatRanges(ids []int) string {
	s := slices.Sorted(slices.Values(ids))
	s = slices.Compact(s)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}
