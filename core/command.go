package core

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Verb is an operator command.
type Verb uint8

// The operator commands of DESIGN.md section 4.
const (
	VerbReset    Verb = iota + 1 // close with 4000 and reconnect at once
	VerbStop                     // close with 4000, state STOPPED
	VerbStart                    // start a stopped shard
	VerbIdentify                 // end the session (close 1000) and start a new one
	VerbRetry                    // leave FATAL and start
	VerbLease                    // arm, renew or turn off the lease
)

var verbNames = [...]string{"", "reset", "stop", "start", "identify", "retry", "lease"}

func (v Verb) String() string {
	if int(v) < len(verbNames) {
		return verbNames[v]
	}
	return "unknown"
}

// MaxCommandShards bounds the shard IDs one command line may name, so that
// a short line such as "reset 0-999999" cannot make the node allocate
// without bound; "all" has no such limit.
const MaxCommandShards = 1 << 16

// Lease durations outside this range are refused: under a second cannot
// be renewed reliably from a shell loop, over a day is a typo.
const (
	MinLease = time.Second
	MaxLease = 24 * time.Hour
)

// Command is a parsed operator command.
type Command struct {
	Verb Verb
	// All targets every local shard (node ctl). Otherwise Shards names the
	// targets; a shard's own ctl fills in its ID.
	All    bool
	Shards []int
	// Lease is the duration of "lease DURATION"; LeaseOff is "lease off".
	Lease    time.Duration
	LeaseOff bool
}

// String returns the command in the text form its parser reads.
func (c Command) String() string {
	var b strings.Builder
	b.WriteString(c.Verb.String())
	switch {
	case c.Verb == VerbLease && c.LeaseOff:
		b.WriteString(" off")
	case c.Verb == VerbLease:
		b.WriteString(" " + c.Lease.String())
	case c.All:
		b.WriteString(" all")
	default:
		for _, id := range c.Shards {
			b.WriteString(" " + strconv.Itoa(id))
		}
	}
	return b.String()
}

// Usage lines, one per accepted command, as reading a ctl file shows them.
const (
	ShardUsage = "reset\nstop\nstart\nidentify\nretry\nlease DURATION\nlease off\n"
	NodeUsage  = "reset all|ID...\nstop all|ID...\nstart all|ID...\nidentify all|ID...\nretry all|ID...\nlease DURATION\nlease off\n"
)

// CommandError is a refused command line. It names the offending word and
// carries the usage.
type CommandError struct {
	Word   string
	Reason string
	Usage  string
	Err    error // ErrUsage or ErrUnknownShard
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%q: %s; usage: %s", e.Word, e.Reason, strings.ReplaceAll(strings.TrimSuffix(e.Usage, "\n"), "\n", " | "))
}

func (e *CommandError) Unwrap() error { return e.Err }

// ParseCommand reads one line written to the node's ctl file.
func ParseCommand(line string) (Command, error) { return parseCommand(line, true) }

// ParseShardCommand reads one line written to a shard's ctl file. The
// returned command has no targets; the caller names the shard.
func ParseShardCommand(line string) (Command, error) { return parseCommand(line, false) }

// The reasons of a line whose first word is no command.
const (
	reasonEmpty   = "empty command"
	reasonUnknown = "unknown command"
)

func parseCommand(line string, node bool) (Command, error) {
	usage := ShardUsage
	if node {
		usage = NodeUsage
	}
	bad := func(word, format string, args ...any) (Command, error) {
		return Command{}, &CommandError{Word: word, Reason: fmt.Sprintf(format, args...), Usage: usage, Err: ErrUsage}
	}
	words := strings.Fields(line)
	if len(words) == 0 {
		return bad(line, reasonEmpty)
	}
	var c Command
	for v := VerbReset; v <= VerbLease; v++ {
		if words[0] == v.String() {
			c.Verb = v
		}
	}
	if c.Verb == 0 {
		return bad(words[0], reasonUnknown)
	}
	args := words[1:]
	if c.Verb == VerbLease {
		c.All = node // the node's lease covers every local shard
		if len(args) == 0 {
			return bad(words[0], "lease needs a duration or off")
		}
		if len(args) > 1 {
			return bad(args[1], "unexpected argument")
		}
		if args[0] == "off" {
			c.LeaseOff = true
			return c, nil
		}
		d, err := time.ParseDuration(args[0])
		if err != nil {
			return bad(args[0], "not a duration such as 30s or 2m")
		}
		if d < MinLease || d > MaxLease {
			return bad(args[0], "lease must be between %v and %v", MinLease, MaxLease)
		}
		c.Lease = d
		return c, nil
	}
	if !node {
		if len(args) > 0 {
			return bad(args[0], "unexpected argument")
		}
		return c, nil
	}
	if len(args) == 0 {
		return bad(words[0], "%s needs all or shard IDs", c.Verb)
	}
	if args[0] == "all" {
		if len(args) > 1 {
			return bad(args[1], "all takes no shard IDs")
		}
		c.All = true
		return c, nil
	}
	seen := make(map[int]bool)
	for _, w := range args {
		if lo, hi, ok := strings.Cut(w, "-"); ok {
			a, errA := parseShardID(lo)
			b, errB := parseShardID(hi)
			if errA == nil && errB == nil && b-a+len(c.Shards) >= MaxCommandShards {
				return bad(w, "a command names at most %d shards; use all", MaxCommandShards)
			}
		}
		ids, err := ParseShardList(w)
		if err != nil || strings.Contains(w, ",") {
			return bad(w, "not a shard ID or range")
		}
		if len(c.Shards)+len(ids) > MaxCommandShards {
			return bad(w, "a command names at most %d shards; use all", MaxCommandShards)
		}
		for _, id := range ids {
			if seen[id] {
				return bad(w, "shard %d named twice", id)
			}
			seen[id] = true
		}
		c.Shards = append(c.Shards, ids...)
	}
	return c, nil
}
