package supervisor

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
)

// Every refused write to the parent's ctl and send files returns its
// reason, and the events log beside the file says it too: under 9P2000.L
// an error reaches the client as an errno alone, and `shardfs write`
// shows the newest event=rejected line of that log.
//
// A refusal of the parent's own (a line it cannot parse or route, a
// child that is not running) is logged by the parent. A refusal of a
// child is logged by the child, and that line reaches the parent's log
// through the child's copy of its events: the parent reads the child's
// line (its reason becomes the parent's error) and waits, at most
// TreeConfig.Timeout, for the copy to arrive, so that the writer finds
// it as soon as the write returns; when it does not arrive, or the child
// logged none (past its rate limit), the parent logs one of its own.
// The parent's own lines are rate-limited as the core's are: at most
// refusal.Burst a window per log and refusal.NodeBurst node-wide, the
// rest counted and summed up in one rejected-suppressed line when the
// window ends.

// refuse logs a refusal of line with err's reason to the node's events
// and, for a shard's file (sl set), to the shard's, and returns err.
func (t *Tree) refuse(sl *shardLogs, line string, err error) error {
	t.logRefusal(sl, line, reason(err))
	return err
}

// reason is err's text without the kind fsrv answers with (the errno
// says that much), as the core's lines give it, and without the
// writer's words (see package refusal).
func reason(err error) string {
	s := err.Error()
	for _, kind := range []error{fs.ErrInvalid, fsrv.ErrBusy} {
		s = strings.TrimPrefix(s, kind.Error()+": ")
	}
	return refusal.Elide(s)
}

// logRefusal logs a refused line by its command word (when it is one of
// the tree's) and length, never its content, under the core's limits.
func (t *Tree) logRefusal(sl *shardLogs, line, reason string) {
	shard := -1
	if sl != nil {
		shard = sl.id
	}
	now := t.clk.Now()
	own, toNode := t.rejectLimiter().Admit(shard, now)
	if !own || sl == nil && !toNode {
		return
	}
	word := refusal.Word(line, knownWord(line))
	t.appendRefusal(sl, toNode, eventLine(now, shard, "rejected", "cmd", word, "len", strconv.Itoa(len(line)), "err", refusal.Clip(reason, 256)))
}

// knownWord reports whether line's first word is a command of a ctl or
// send file of the tree: the core's, the parent's own and the node's
// hooks'.
func knownWord(line string) bool {
	f := strings.Fields(line)
	if len(f) == 0 {
		return false
	}
	for _, usage := range []string{core.NodeUsage, core.ShardUsage, Usage, "send\ndrain\nreshard\n"} {
		for _, l := range strings.Split(usage, "\n") {
			if w := strings.Fields(l); len(w) > 0 && w[0] == f[0] {
				return true
			}
		}
	}
	return false
}

// rejectLimiter returns the tree's refusal limiter, made on first use:
// a shard's summary goes to its events (and the node's, within the
// node-wide budget), the node's to the node's.
func (t *Tree) rejectLimiter() *refusal.Limiter {
	t.rejectsOnce.Do(func() {
		t.rejects = &refusal.Limiter{Clock: t.clk, Flush: func(key, suppressed int, window time.Duration, now time.Time, toNode bool) {
			sl := t.shards[key] // nil for the node's ctl and refusal.All
			id := key
			if sl == nil {
				id = -1
			}
			kv := []string{"suppressed", strconv.Itoa(suppressed), "window", window.String()}
			if key == refusal.All {
				kv = append([]string{"scope", "node"}, kv...)
			}
			t.appendRefusal(sl, toNode, eventLine(now, id, "rejected-suppressed", kv...))
		}}
	})
	return t.rejects
}

func (t *Tree) appendRefusal(sl *shardLogs, toNode bool, line []byte) {
	now := t.clk.Now()
	if sl != nil {
		sl.events.AppendLine(line, now)
	}
	if toNode {
		t.events.AppendLine(line, now)
	}
}

func (t *Tree) appendEvent(sl *shardLogs, line []byte) {
	now := t.clk.Now()
	if sl != nil {
		sl.events.AppendLine(line, now)
	}
	t.events.AppendLine(line, now)
}

// eventLine is one logfmt line of an events log; shard -1 is a
// node-level line, which names no shard.
func eventLine(now time.Time, shard int, event string, kv ...string) []byte {
	var b strings.Builder
	b.WriteString("ts=" + now.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	if shard >= 0 {
		b.WriteString(" shard=" + strconv.Itoa(shard))
	}
	b.WriteString(" event=" + event)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if q := strconv.Quote(v); v == "" || strings.ContainsAny(v, " \"=\\") || q != `"`+v+`"` {
			v = q
		}
		b.WriteString(" " + kv[i] + "=" + v)
	}
	b.WriteByte('\n')
	return []byte(b.String())
}

// forward writes line to the file path (ctl or send, of the node or of
// shard sl) of child i. A child's refusal comes back with the reason its
// events log gives (see the comment at the top of this file).
func (t *Tree) forward(i int, sl *shardLogs, path, line string) error {
	parent := t.events
	if sl != nil {
		parent = sl.events
	}
	mark := parent.Size()
	var childLine []byte
	err := t.call(i, func(root p9.File) error {
		events := path[:strings.LastIndexByte(path, '/')+1] + "events"
		before, _ := sizeOf(root, events)
		err := writeLine(root, path, line)
		if errors.Is(err, linux.EINVAL) {
			childLine = lastRejected(root, events, before)
		}
		return err
	})
	if err == nil {
		return nil
	}
	id := t.cfg.Assignment.Blocks[i].ID
	if childLine == nil {
		// The parent's own refusal (the child is not running or did not
		// answer), or a child's past its rate limit.
		return &loggedRefusal{t.refuse(sl, line, err)}
	}
	reason := logfmtValue(childLine, "err")
	err = &childRefusal{child: id, reason: reason, err: err}
	if !t.waitLine(parent, mark, childLine) {
		t.logRefusal(sl, line, err.Error())
	}
	return err
}

// childRefusal is a child's refusal with the reason its events gave; it
// wraps the parent's error for the child's errno.
type childRefusal struct {
	child, reason string
	err           error
}

func (e *childRefusal) Error() string { return "child " + e.child + ": " + e.reason }
func (e *childRefusal) Unwrap() error { return e.err }

// loggedRefusal is a refusal forward logged already.
type loggedRefusal struct{ err error }

func (e *loggedRefusal) Error() string { return e.err.Error() }
func (e *loggedRefusal) Unwrap() error { return e.err }

// logged reports whether forward logged err's refusals.
func logged(err error) bool {
	var cr *childRefusal
	var lr *loggedRefusal
	return errors.As(err, &cr) || errors.As(err, &lr)
}

// waitLine waits, at most the tree's timeout, for line to be in log past
// offset mark.
func (t *Tree) waitLine(log *journal.Log, mark int64, line []byte) bool {
	timer := time.NewTimer(t.cfg.Timeout)
	defer timer.Stop()
	for {
		ch := log.Notify()
		buf := make([]byte, log.Size()-mark)
		n, _ := log.ReadAt(buf, mark)
		if bytes.Contains(buf[:n], line) {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

func sizeOf(root p9.File, path string) (int64, error) {
	f, err := walkTo(root, path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
	return int64(attr.Size), err
}

func writeLine(root p9.File, path, line string) error {
	f, err := walkTo(root, path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(line+"\n"), 0)
	return err
}

// lastRejected returns the newest event=rejected line of the events log
// at path past offset from (with its newline), or nil.
func lastRejected(root p9.File, path string, from int64) []byte {
	f, err := walkTo(root, path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return nil
	}
	var out []byte
	buf := make([]byte, 8<<10)
	for off := from; len(out) < 64<<10; {
		n, err := f.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if n == 0 || err != nil && err != io.EOF {
			break
		}
	}
	lines := bytes.SplitAfter(out, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.Contains(lines[i], []byte(" event=rejected ")) && bytes.HasSuffix(lines[i], []byte("\n")) {
			return lines[i]
		}
	}
	return nil
}

// logfmtValue returns the value of key in a logfmt line, unquoted.
func logfmtValue(line []byte, key string) string {
	s := string(bytes.TrimSpace(line))
	i := strings.Index(s, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := s[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if q, err := strconv.QuotedPrefix(v); err == nil {
			u, _ := strconv.Unquote(q)
			return u
		}
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}
