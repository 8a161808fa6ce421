package soak

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// delivered is one dispatch line as the soak reads it from a node's
// /dispatch: the names by which another node's copy of the same event is
// recognised.
type delivered struct {
	shard   int
	session string // core.SessionKey; "" before READY
	s       int64  // -1: none (RESUMED)
	t       string
	msg     string    // a MESSAGE_CREATE's id, "" for other events
	posted  time.Time // when the simulator made the message (its id's time); zero for other events
}

// event is (shard, session key, s), which names one event across nodes
// and restarts (doc/shardfs.4.md, Lines).
type event struct {
	shard   int
	session string
	s       int64
}

func (d delivered) event() (event, bool) {
	if d.session == "" || d.s < 0 {
		return event{}, false
	}
	return event{d.shard, d.session, d.s}, true
}

// parseDispatch reads dispatch lines. A line cut at the end (a read that
// raced an append) is left out.
func parseDispatch(text string) ([]delivered, error) {
	var out []delivered
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			continue
		}
		var l struct {
			Shard   int     `json:"shard"`
			S       *int64  `json:"s"`
			T       string  `json:"t"`
			Session *string `json:"session"`
			D       struct {
				ID string `json:"id"`
			} `json:"d"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			if !strings.HasSuffix(text, "\n") && strings.HasSuffix(text, line) {
				break
			}
			return out, fmt.Errorf("dispatch line %.80q: %v", line, err)
		}
		d := delivered{shard: l.Shard, s: -1, t: l.T}
		if l.S != nil {
			d.s = *l.S
		}
		if l.Session != nil {
			d.session = *l.Session
		}
		if l.T == "MESSAGE_CREATE" && l.D.ID != "" {
			d.msg = l.D.ID
			if id, err := strconv.ParseUint(l.D.ID, 10, 64); err == nil {
				d.posted = snowflakeTime(id)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// discordEpoch is the first millisecond of 2015 in Unix milliseconds:
// a snowflake's upper bits count milliseconds from it (the simulator's
// message ids are made from its clock the same way).
const discordEpoch = 1420070400000

// snowflakeTime is when a snowflake id was made.
func snowflakeTime(id uint64) time.Time {
	return time.UnixMilli(int64(id>>22) + discordEpoch)
}

// Wake is what a node woken from SIGSTOP delivered after its deadline. It
// was stopped past the TTL, so anything it read after SIGCONT on a session
// it held before the stop came after its lease's end, and another node had
// its shards by then.
type Wake struct {
	Fault int
	Node  string
	// Stale counts the dispatch lines the node appended after SIGCONT on a
	// session it held before the stop, for a message the simulator made
	// after the stop: events received after its deadline. The read fence
	// (nothing received past the deadline reaches dispatch) makes it 0.
	Stale int
	// Copies counts those of the Stale lines, and of the other lines on a
	// held session, that another node also delivered, recognised by
	// (shard, session key, s) or by the simulator's message id: what a
	// reader of both nodes would see twice.
	Copies int
	// Replayed counts its lines on sessions it took up after waking that
	// another node also delivered, by (shard, session key, s): a resume's
	// replay of what the previous holder had delivered, which the tree's
	// reference lets a reader drop. Reported, not a violation.
	Replayed int
	Lines    int // every line it appended after the stop, its new sessions' included
	// Held counts the (shard, session key) pairs its lines just before
	// the stop named: the sessions whose later lines would be stale. Zero
	// would make the check see nothing.
	Held int
}

// wakeDeliveries compares the lines a woken node appended after its stop
// (after) with those it appended shortly before (before, which name the
// sessions it held) and with what the other nodes appended over the same
// span (others).
func wakeDeliveries(before, after, others []delivered, stopped time.Time) Wake {
	type shardSession struct {
		shard   int
		session string
	}
	held := map[shardSession]bool{}
	for _, d := range before {
		if d.session != "" {
			held[shardSession{d.shard, d.session}] = true
		}
	}
	events, msgs := map[event]bool{}, map[string]bool{}
	for _, d := range others {
		if e, ok := d.event(); ok {
			events[e] = true
		}
		if d.msg != "" {
			msgs[d.msg] = true
		}
	}
	w := Wake{Held: len(held)}
	for _, d := range after {
		w.Lines++
		e, named := d.event()
		copied := (named && events[e]) || (d.msg != "" && msgs[d.msg])
		switch {
		case held[shardSession{d.shard, d.session}]:
			if !d.posted.IsZero() && !d.posted.Before(stopped) {
				w.Stale++
			}
			if copied {
				w.Copies++
			}
		case copied:
			w.Replayed++
		}
	}
	return w
}

// dispatchEnds returns the end offset of each readable node's /dispatch.
func (c *cluster) dispatchEnds() (map[string]int64, error) {
	out := map[string]int64{}
	for _, n := range c.nodes {
		if !n.Running() || c.isPaused(n) {
			continue
		}
		end, err := n.Size("dispatch")
		if err != nil {
			return nil, err
		}
		out[n.Name] = end
	}
	return out, nil
}

// heldSpan is how much of a node's /dispatch before its stop the soak reads
// to learn the sessions it held: 16 shards at the simulator's 2 events a
// second write about 30 KiB a second.
const heldSpan = 256 << 10

// checkWakeDeliveries reads what the node of a pause fault and the other
// nodes appended to their /dispatch since ends (taken just before the
// stop), once the cluster has recovered, and records what the woken node
// delivered after its deadline; any such event is a violation (issue 22,
// item 1: nothing received after the deadline reaches dispatch).
func (c *cluster) checkWakeDeliveries(rep *Report, f fault, ends map[string]int64, stopped time.Time) error {
	var before, after, others []delivered
	for _, n := range c.nodes {
		end, ok := ends[n.Name]
		if !ok {
			continue
		}
		from := end
		if n == f.node {
			from = max(0, end-heldSpan)
		}
		text, _, err := n.ReadFrom("dispatch", from)
		if err != nil {
			return err
		}
		if from < end {
			// Skip the line the read began inside; split at the stop.
			cut := min(int64(len(text)), end-from)
			head, tail := text[:cut], text[cut:]
			if i := strings.IndexByte(head, '\n'); from > 0 && i >= 0 {
				head = head[i+1:]
			}
			if before, err = parseDispatch(head); err != nil {
				return fmt.Errorf("%s: %w", n.Name, err)
			}
			text = tail
		}
		lines, err := parseDispatch(text)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if n == f.node {
			after = lines
		} else {
			others = append(others, lines...)
		}
	}
	w := wakeDeliveries(before, after, others, stopped)
	w.Fault, w.Node = f.n, f.node.Name
	rep.Wakes = append(rep.Wakes, w)
	if w.Stale > 0 || w.Copies > 0 {
		rep.Violations = append(rep.Violations, fmt.Sprintf("fault %d: %s, woken from SIGSTOP, delivered %d events after its deadline on the sessions it held before the stop, %d of them (or of other lines on those sessions) delivered by another node too", f.n, w.Node, w.Stale, w.Copies))
	}
	return nil
}
