package core

import (
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/shardfs/shardfs/internal/refusal"
)

// A refusal's events line is at most maxRejectedLine bytes whatever was
// written: it names the command word (or the op of a send) and the
// length, never the content (see package refusal), and the reason is
// clipped to what the line has room for.
const maxRejectedLine = 256

// rejectReason is the text of a refusal's reason without the writer's
// words: a CommandError's reason names them only through its Word, which
// the line leaves out; any other error has its quoted parts elided.
func rejectReason(err error) string {
	var ce *CommandError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return refusal.Elide(err.Error())
}

// known reports whether a refused line's first word is a command of the
// file it was written to: every refusal but "unknown command" and an
// empty line comes from a parser that recognised the word.
func known(err error) bool {
	var ce *CommandError
	return !errors.As(err, &ce) || ce.Reason != reasonUnknown && ce.Reason != reasonEmpty
}

// Reject logs a refused line of the node's /ctl that a command outside
// the core refused (the tree's Command hook: drain, reshard), as the
// core logs its own: an event=rejected line in the node's events with the
// command word, the length and the reason, under the same rate limit. A
// client over 9P2000.L, whose errors carry an errno alone, finds the
// reason there.
func (n *Scheduler) Reject(line string, err error) { n.reject(nil, line, err) }

// reject logs a refused command line, unless the shard (or the node's
// ctl) or the node as a whole has had its burst of refusal lines in this
// window; see package refusal.
func (n *Scheduler) reject(s *shard, line string, err error) {
	e, now, toNode := n.rejectLine(s)
	if e == nil {
		return
	}
	e.str("cmd", refusal.Word(line, known(err))).int("len", int64(len(line)))
	n.finishReject(s, e, err, now, toNode)
}

// rejectSend logs a refused send by its op, when it has one, and length.
func (n *Scheduler) rejectSend(s *shard, payload []byte, err error) {
	e, now, toNode := n.rejectLine(s)
	if e == nil {
		return
	}
	e.str("cmd", "send")
	var env struct{ Op *int }
	if json.Unmarshal(payload, &env) == nil && env.Op != nil {
		e.int("op", int64(*env.Op))
	}
	e.int("len", int64(len(payload)))
	n.finishReject(s, e, err, now, toNode)
}

// rejectLine starts a refusal line of shard s (nil: the node's ctl), or
// returns nil when the rate limits hold it back; toNode says whether it
// goes to the node's events too.
func (n *Scheduler) rejectLine(s *shard) (e *eventLine, now time.Time, toNode bool) {
	id := -1
	if s != nil {
		id = s.id
	}
	now = n.clock.Now()
	own, toNode := n.rejectLimiter().Admit(id, now)
	if !own || s == nil && !toNode {
		return nil, now, false
	}
	return newEventLine(now, id, "rejected", slog.LevelWarn, n.log), now, toNode
}

func (n *Scheduler) finishReject(s *shard, e *eventLine, err error, now time.Time, toNode bool) {
	// Escaping can make a byte four: clip until the quoted form fits.
	room := maxRejectedLine - len(e.b) - len(" err=\n")
	reason := rejectReason(err)
	var buf [maxRejectedLine + 8]byte
	for n := room; n > 0 && len(appendLogfmtValue(buf[:0], reason)) > room; n -= 8 {
		reason = refusal.Clip(reason, n-len("..."))
	}
	e.str("err", reason)
	n.logReject(s, e, now, toNode)
}

func (n *Scheduler) logReject(s *shard, e *eventLine, now time.Time, toNode bool) {
	b := e.finish(n.log)
	if s != nil {
		s.events.Append(b, now)
	}
	if toNode {
		n.events.Append(b, now)
	}
	e.release()
}

// rejectLimiter returns the node's refusal limiter, made on first use. A
// summary of a shard's window goes to its events (and the node's, within
// the node-wide budget); the node-wide one and the node ctl's to the
// node's only.
func (n *Scheduler) rejectLimiter() *refusal.Limiter {
	n.rejectsOnce.Do(func() {
		n.rejects = &refusal.Limiter{Clock: n.clock, Flush: func(key, suppressed int, window time.Duration, now time.Time, toNode bool) {
			s := n.shards[key] // nil for the node's ctl and for refusal.All
			id := key
			if s == nil {
				id = -1
			}
			e := newEventLine(now, id, "rejected-suppressed", slog.LevelWarn, n.log)
			if key == refusal.All {
				e.str("scope", "node")
			}
			e.int("suppressed", int64(suppressed)).str("window", window.String())
			n.logReject(s, e, now, toNode)
		}}
	})
	return n.rejects
}
