package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/shardfs"
)

// TreeConfig configures the parent's tree.
type TreeConfig struct {
	Supervisor *Supervisor
	Assignment Assignment
	Flavor     core.Flavor
	// Info adds key value lines to /plan.
	Info func() [][2]string
	// Identify returns the shared pacer's figures for /identify.
	Identify func() core.Budget
	// Retention of the logs in bytes: each shard's dispatch, the node's
	// dispatch, each shard's events and the node's events (0: serve's
	// defaults, 256 KiB, 16 MiB, 16 KiB, 1 MiB).
	DispatchRetention, NodeDispatchRetention, EventRetention, NodeEventRetention int
	// Timeout bounds one forwarded request to a child (0: 2 s).
	Timeout time.Duration
	Clock   clock.Clock
	Logger  *slog.Logger
}

// Tree is the parent's tree: every shard's /N, the node files combined
// from the children's, /children, and /ctl.
//
// /N/state, sequence, reconnects, diag, ctl and send are forwarded to the
// owning child over 9P on its private unix socket. /dispatch, /events and
// each /N/dispatch and /N/events are the parent's own logs, built from the
// lines every child copies over its channel, so they survive the child's
// restarts with their offsets going on; /N/sequence is the last sequence
// the parent saw in that stream while the child is down.
type Tree struct {
	cfg  TreeConfig
	log  *slog.Logger
	clk  clock.Clock
	root *fsrv.Dir
	top  []fsrv.File

	dispatch *journal.Merged
	events   *journal.Log
	shards   map[int]*shardLogs

	mu    sync.Mutex
	conns []*childConn   // by block index
	gaps  map[string]int // gap lines by child, any log

	rejectsOnce sync.Once
	rejects     *refusal.Limiter // the parent's own refusal lines; see rejectLimiter
}

// childConn is the parent's 9P connection to one child, dialled when a
// forwarded request needs it. Its mutex guards the pointer only: the dial
// and every request run without it.
type childConn struct {
	mu sync.Mutex
	cc *childClient
}

type shardLogs struct {
	id       int
	owner    int // index of the block
	dispatch *journal.Log
	events   *journal.Log
	lastSeq  int64 // -1: none
	// The session the parent could resume (guarded by Tree.mu): pending
	// from the child's report until its READY line reaches the parent's
	// log, which orders it among the dispatches; then current, whose
	// dispatches lastSeq counts.
	pending, current core.Session
	pendingSeq       int64
	// readyWaits: a READY line at readySeq came with no report yet.
	readySeq   int64
	readyWaits bool
	// pushed is what the owning child (of generation pushedGen) last
	// pushed of the shard (guarded by Tree.mu).
	pushed    ShardState
	pushedGen int
	once      sync.Once
	dir       *fsrv.Dir
}

type childClient struct {
	socket string
	gen    int
	conn   net.Conn
	client *p9.Client
	root   p9.File
}

// NewTree returns the parent's tree.
func NewTree(cfg TreeConfig) *Tree {
	t := &Tree{cfg: cfg, log: cfg.Logger, clk: clock.Or(cfg.Clock), shards: map[int]*shardLogs{}}
	for range cfg.Assignment.Blocks {
		t.conns = append(t.conns, &childConn{})
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.cfg.Timeout == 0 {
		t.cfg.Timeout = 2 * time.Second
	}
	t.dispatch = journal.NewMerged(orDefault(cfg.NodeDispatchRetention, 16<<20))
	t.events = journal.New(orDefault(cfg.NodeEventRetention, 1<<20))
	for i, b := range cfg.Assignment.Blocks {
		for _, id := range b.Shards {
			t.shards[id] = &shardLogs{id: id, owner: i, lastSeq: -1,
				dispatch: journal.New(orDefault(cfg.DispatchRetention, 256<<10)),
				events:   journal.New(orDefault(cfg.EventRetention, 16<<10))}
		}
	}
	t.top = []fsrv.File{
		&fsrv.Ctl{Name: "ctl", Handle: t.ctl, Usage: func() string { return Usage }},
		&fsrv.Text{Name: "children", Content: t.children},
		&fsrv.LogFile{Name: "events", Source: t.events},
		&fsrv.Text{Name: "status", Content: t.status},
		&fsrv.Text{Name: "plan", Content: t.plan},
		&fsrv.Text{Name: "identify", Content: t.identify},
		&fsrv.Text{Name: "metrics", Content: t.metrics},
		&fsrv.LogFile{Name: "dispatch", Source: t.dispatch, Private: true},
	}
	t.root = &fsrv.Dir{List: t.list, Lookup: t.lookup}
	return t
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Root returns the tree's root.
func (t *Tree) Root() *fsrv.Dir { return t.root }

// Dispatches returns the parent's /dispatch log.
func (t *Tree) Dispatches() *journal.Merged { return t.dispatch }

// Line takes a dispatch or event line a child copied (Exec calls it);
// the logs copy what they keep, so line may be reused once Line returns.
// A line for a shard the child does not own is dropped and logged: a
// child speaks for its own block only.
func (t *Tree) Line(child, kind string, line []byte) {
	now := t.clk.Now()
	switch kind {
	case "dispatch":
		shard, seq, ok := dispatchShardSeq(line)
		sl := t.shards[shard]
		if !ok || !oneShardKey(line) || sl == nil || t.cfg.Assignment.Blocks[sl.owner].ID != child {
			t.log.Warn("dropped a dispatch line for a shard the child does not own", "child", child, "shard", shard)
			return
		}
		_, l := sl.dispatch.AppendLine(line, now)
		t.dispatch.Add(l, now)
		if seq >= 0 {
			t.mu.Lock()
			sl.lastSeq = seq
			if isReady(line) {
				sl.current, sl.readySeq, sl.readyWaits = core.Session{}, seq, true
				if sl.pending.ID != "" && sl.pendingSeq == seq {
					sl.current, sl.pending, sl.readyWaits = sl.pending, core.Session{}, false
				}
			}
			t.mu.Unlock()
		}
	case "event":
		// A line about a shard outside the child's block is no line of
		// the child's to write (the attack on issue 23 forged a FATAL
		// 4004 for another child's shard into /events).
		// Only the canonical form (ts=T shard=N event=E ..., or
		// ts=T event=E ... for the child's node-level lines), so that
		// what readers parse is what was checked: a tab before shard=
		// or a second shard key passed the check once.
		shard, hasShard, ok := canonicalEventShard(line)
		if !ok {
			t.log.Warn("dropped an events line not in the canonical form", "child", child)
			return
		}
		if hasShard {
			if sl := t.shards[shard]; sl == nil || t.cfg.Assignment.Blocks[sl.owner].ID != child {
				t.log.Warn("dropped an events line for a shard the child does not own", "child", child, "shard", shard)
				return
			}
		}
		t.events.AppendLine(line, now)
		if isGap(line) {
			t.mu.Lock()
			if t.gaps == nil {
				t.gaps = map[string]int{}
			}
			t.gaps[child]++
			t.mu.Unlock()
			if bytes.Contains(line, []byte(" log=dispatch ")) {
				if hasShard {
					t.shardGap(t.shards[shard], line)
				} else {
					t.gap(child, line)
				}
			}
		}
		if hasShard {
			if sl := t.shards[shard]; sl != nil && t.cfg.Assignment.Blocks[sl.owner].ID == child {
				sl.events.AppendLine(line, now)
			}
		}
	}
}

// Session takes a new session a child reported (Exec calls it).
func (t *Tree) Session(child string, shard int, s core.Session, seq int64) {
	sl := t.shards[shard]
	if sl == nil || t.cfg.Assignment.Blocks[sl.owner].ID != child || s.ID == "" {
		t.log.Warn("dropped a session report for a shard the child does not own", "child", child, "shard", shard)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if sl.readyWaits && sl.readySeq == seq {
		// The READY line came first (the log's copy overtook the report).
		sl.current, sl.readyWaits = s, false
		return
	}
	sl.pending, sl.pendingSeq = s, seq
}

// State takes a shard's state that child (of generation gen) pushed
// (Exec calls it); the parent answers /status, /N/state, /N/sequence and
// /N/reconnects from it, without asking the child.
func (t *Tree) State(child string, gen, shard int, st ShardState) {
	sl := t.shards[shard]
	if sl == nil || t.cfg.Assignment.Blocks[sl.owner].ID != child {
		t.log.Warn("dropped a state for a shard the child does not own", "child", child, "shard", shard)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if sl.pushedGen == gen && st.Reconnects < sl.pushed.Reconnects {
		// A process's count only grows.
		t.log.Warn("dropped a state whose reconnects went down", "child", child, "shard", shard, "reconnects", st.Reconnects, "before", sl.pushed.Reconnects)
		return
	}
	sl.pushed, sl.pushedGen = st, gen
}

// shardState is what the parent shows of sl: what its child pushed while
// that child runs, else ASSIGNED with the last sequence the parent saw.
func (t *Tree) shardState(sl *shardLogs) ShardState {
	info := t.cfg.Supervisor.Child(sl.owner)
	t.mu.Lock()
	defer t.mu.Unlock()
	if info.State == Running && sl.pushedGen == info.Generation && sl.pushed.State != "" {
		return sl.pushed
	}
	return ShardState{State: "ASSIGNED", Seq: sl.lastSeq, NoSeq: sl.lastSeq < 0}
}

func (st ShardState) appendSeq(b []byte) []byte {
	if st.NoSeq {
		return append(b, "none"...)
	}
	return strconv.AppendInt(b, st.Seq, 10)
}

// ResumePoint is where a crashed child's shard can resume: its session
// and the last sequence the parent's /dispatch holds of it.
type ResumePoint struct {
	Shard    int
	Session  core.Session
	Sequence int64
}

// ResumePoints returns, for child's shards, the sessions whose READY
// and dispatches the parent has seen. Call it only once the child's
// process was reaped, so that nobody else holds them.
func (t *Tree) ResumePoints(child string) []ResumePoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []ResumePoint
	for i, b := range t.cfg.Assignment.Blocks {
		if b.ID != child {
			continue
		}
		for _, id := range t.cfg.Assignment.Blocks[i].Shards {
			sl := t.shards[id]
			if sl.current.ID != "" && sl.lastSeq >= 0 {
				out = append(out, ResumePoint{Shard: id, Session: sl.current, Sequence: sl.lastSeq})
			}
		}
	}
	return out
}

// isGap: a child's gap line (see Link.CopyDispatch and Link.Copy), of
// one shard's dispatch lines or, without a shard, of any.
func isGap(line []byte) bool {
	return bytes.Contains(line, []byte(" event=gap "))
}

// shardGap takes a child's gap line for one shard: the parent's /dispatch
// has a hole in that shard's lines, so it does not resume from the
// parent's points after a crash (it would resume past the hole, which the
// gateway would then never replay) until its next session; the child's
// other shards still do.
func (t *Tree) shardGap(sl *shardLogs, line []byte) {
	t.log.Warn("a child's copy of a shard's dispatch lines lost some: that shard will not resume from the parent's points after a crash", "shard", sl.id, "line", string(bytes.TrimSpace(line)))
	t.mu.Lock()
	defer t.mu.Unlock()
	sl.current, sl.pending, sl.readyWaits = core.Session{}, core.Session{}, false
}

// gap takes a child's gap line that names no shard: its copy of its
// dispatch log lost lines before it knew whose, so the parent's /dispatch
// may have a hole in any of its shards; none of them resumes from the
// parent's points after a crash.
func (t *Tree) gap(child string, line []byte) {
	t.log.Warn("a child's copy of its log lost lines: its shards will not resume from the parent's points after a crash", "child", child, "line", string(bytes.TrimSpace(line)))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.cfg.Assignment.Blocks {
		if b.ID != child {
			continue
		}
		for _, id := range b.Shards {
			sl := t.shards[id]
			sl.current, sl.pending, sl.readyWaits = core.Session{}, core.Session{}, false
		}
	}
}

func isReady(line []byte) bool {
	i := bytes.Index(line, []byte(`,"t":`))
	return i >= 0 && bytes.HasPrefix(line[i+len(`,"t":`):], []byte(`"READY"`))
}

// dispatchShardSeq reads the shard and the sequence at the start of a
// dispatch line: {"shard":3,"s":42,...} (s null: -1).
func dispatchShardSeq(line []byte) (shard int, seq int64, ok bool) {
	rest, found := bytes.CutPrefix(line, dispatchPrefix)
	if !found {
		return 0, 0, false
	}
	i := bytes.IndexByte(rest, ',')
	if i < 0 {
		return 0, 0, false
	}
	shard, err := strconv.Atoi(string(rest[:i]))
	if err != nil {
		return 0, 0, false
	}
	rest, found = bytes.CutPrefix(rest[i:], []byte(`,"s":`))
	if !found {
		return 0, 0, false
	}
	if j := bytes.IndexByte(rest, ','); j >= 0 {
		if s, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil {
			return shard, s, true
		}
	}
	return shard, -1, true
}

// oneShardKey reports whether the JSON object line has one top-level key
// that a reader could take for "shard" (the one dispatchShardSeq read):
// with a second, encoding/json and most readers take the last. A key
// with an escape, or "shard" in another case (which encoding/json
// matches to a Shard field), counts too. The READY payload's own
// "shard" is inside "d", not at the top.
func oneShardKey(line []byte) bool {
	n, depth, expectKey, inStr, esc, keyStart := 0, 0, false, false, false, -1
	for i, b := range line {
		if inStr {
			switch {
			case esc:
				esc = false
			case b == '\\':
				esc = true
			case b == '"':
				inStr = false
				if keyStart >= 0 {
					k := line[keyStart:i]
					if bytes.EqualFold(k, []byte("shard")) || bytes.IndexByte(k, '\\') >= 0 {
						n++
					}
					keyStart = -1
				}
			}
			continue
		}
		switch b {
		case '"':
			inStr = true
			if depth == 1 && expectKey {
				keyStart, expectKey = i+1, false
			}
		case '{', '[':
			depth++
			expectKey = depth == 1 && b == '{'
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		}
	}
	return n == 1
}

// canonicalEventShard reads an events line as the logs write it:
// ts=T first, then shard=N (none on a node-level line), then event=E,
// then key=value pairs separated by one space, values without spaces or
// control characters unless quoted, and no second ts, shard or event
// key. ok is false for anything else.
func canonicalEventShard(line []byte) (shard int, hasShard, ok bool) {
	line = bytes.TrimSuffix(line, []byte("\n"))
	var keys []string
	for i := 0; len(line) > 0; i++ {
		eq := bytes.IndexByte(line, '=')
		if eq <= 0 {
			return 0, false, false
		}
		key := string(line[:eq])
		for _, c := range []byte(key) {
			if c <= ' ' || c == '"' || c >= 0x7f {
				return 0, false, false
			}
		}
		line = line[eq+1:]
		var val []byte
		if len(line) > 0 && line[0] == '"' {
			end, esc := -1, false
			for j := 1; j < len(line) && end < 0; j++ {
				switch c := line[j]; {
				case c < ' ':
					return 0, false, false
				case esc:
					esc = false
				case c == '\\':
					esc = true
				case c == '"':
					end = j
				}
			}
			if end < 0 {
				return 0, false, false
			}
			val, line = line[:end+1], line[end+1:]
		} else {
			j := bytes.IndexByte(line, ' ')
			if j < 0 {
				j = len(line)
			}
			val, line = line[:j], line[j:]
			for _, c := range val {
				if c < ' ' || c == '"' {
					return 0, false, false
				}
			}
		}
		if len(line) > 0 {
			if line[0] != ' ' || len(line) == 1 {
				return 0, false, false
			}
			line = line[1:]
		}
		switch key {
		case "ts", "shard", "event":
			if slices.Contains(keys, key) {
				return 0, false, false
			}
		}
		switch {
		case i == 0 && key != "ts":
			return 0, false, false
		case key == "shard":
			if i != 1 {
				return 0, false, false
			}
			n, err := strconv.Atoi(string(val))
			if err != nil || n < 0 || string(val) != strconv.Itoa(n) {
				return 0, false, false
			}
			shard, hasShard = n, true
		}
		keys = append(keys, key)
	}
	if len(keys) < 2 || keys[len(keys)-1] == "ts" || !slices.Contains(keys, "event") {
		return 0, false, false
	}
	if hasShard && (len(keys) < 3 || keys[2] != "event") || !hasShard && keys[1] != "event" {
		return 0, false, false
	}
	return shard, hasShard, true
}

// eventShard reads shard=N from a logfmt events line.
func eventShard(line []byte) (int, bool) {
	i := bytes.Index(line, []byte(" shard="))
	if i < 0 {
		return 0, false
	}
	rest := line[i+len(" shard="):]
	j := bytes.IndexAny(rest, " \n")
	if j < 0 {
		j = len(rest)
	}
	n, err := strconv.Atoi(string(rest[:j]))
	return n, err == nil
}

func (t *Tree) list() []fsrv.File {
	out := slices.Clone(t.top)
	ids := make([]int, 0, len(t.shards))
	for id := range t.shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out = append(out, t.shardDir(t.shards[id]))
	}
	return out
}

func (t *Tree) lookup(name string) fsrv.File {
	return shardfs.LookupTop(t.top, name, func(id int) fsrv.File {
		if sl := t.shards[id]; sl != nil {
			return t.shardDir(sl)
		}
		return nil
	})
}

func (t *Tree) shardDir(sl *shardLogs) *fsrv.Dir {
	sl.once.Do(func() {
		id := sl.id
		name := strconv.Itoa(id)
		sl.dir = fsrv.NewDir(name,
			&fsrv.Text{Name: "state", Content: func() []byte { return append([]byte(t.shardState(sl).State), '\n') }},
			&fsrv.Text{Name: "sequence", Content: func() []byte { return append(t.shardState(sl).appendSeq(nil), '\n') }},
			&fsrv.Text{Name: "reconnects", Content: func() []byte {
				return append(strconv.AppendUint(nil, t.shardState(sl).Reconnects, 10), '\n')
			}},
			&fsrv.Ctl{Name: "ctl", Handle: func(line string) error { return t.forward(sl.owner, sl, name+"/ctl", line) }, Usage: func() string { return core.ShardUsage }},
			&fsrv.LogFile{Name: "events", Source: sl.events},
			&fsrv.Text{Name: "diag", Content: func() []byte {
				b, err := t.read(sl.owner, name+"/diag")
				if err != nil {
					return []byte("child " + t.cfg.Assignment.Blocks[sl.owner].ID + " " + string(t.childState(sl.owner)) + "\n")
				}
				return b
			}},
			&fsrv.LogFile{Name: "dispatch", Source: sl.dispatch, Private: true},
			&fsrv.Ctl{Name: "send", Handle: func(line string) error { return t.forward(sl.owner, sl, name+"/send", line) }, Private: true},
		)
	})
	return sl.dir
}

func (t *Tree) childState(i int) State {
	return t.cfg.Supervisor.Child(i).State
}

func (t *Tree) children() []byte {
	var b strings.Builder
	for _, c := range t.cfg.Supervisor.Children() {
		b.WriteString(c.String())
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// status is every shard's line, in shard order, from what the children
// pushed (a child that is not running shows its shards ASSIGNED, with the
// last sequence the parent saw): no child is asked, so a hung one delays
// nothing.
func (t *Tree) status() []byte {
	ids := make([]int, 0, len(t.shards))
	for id := range t.shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]byte, 0, len(ids)*24)
	for _, id := range ids {
		st := t.shardState(t.shards[id])
		out = strconv.AppendInt(out, int64(id), 10)
		out = append(out, ' ')
		out = append(out, st.State...)
		out = append(out, ' ')
		out = st.appendSeq(out)
		out = append(out, ' ')
		out = strconv.AppendUint(out, st.Reconnects, 10)
		out = append(out, ' ')
		out = strconv.AppendInt(out, st.LatencyMs, 10)
		out = append(out, '\n')
	}
	return out
}

func (t *Tree) plan() []byte {
	a := t.cfg.Assignment
	var owned []int
	for _, b := range a.Blocks {
		owned = append(owned, b.Shards...)
	}
	slices.Sort(owned)
	var b strings.Builder
	fmt.Fprintf(&b, "flavor %s\ntotal %d\nshards %s\ncount %d\nchildren %d\n", t.cfg.Flavor, a.Total, FormatShards(owned), len(owned), len(a.Blocks))
	if len(a.Unowned) > 0 {
		fmt.Fprintf(&b, "unowned %s\n", FormatShards(a.Unowned))
	}
	if t.cfg.Info != nil {
		for _, kv := range t.cfg.Info() {
			fmt.Fprintf(&b, "%s %s\n", kv[0], kv[1])
		}
	}
	return []byte(b.String())
}

// identify is /identify of DESIGN.md section 7.2, from the pacer every
// child shares.
func (t *Tree) identify() []byte {
	if t.cfg.Identify == nil {
		return nil
	}
	return shardfs.FormatIdentify(t.cfg.Identify(), t.clk.Now())
}

// Usage is what reading the parent's /ctl shows: the node commands,
// which go to the children that own their shards, and restart.
const Usage = core.NodeUsage + RestartUsage

// RestartUsage is the parent's own command.
const RestartUsage = "restart ID|all\n"

// ctl applies one line of the parent's /ctl: restart ID|all for the
// children, or a node command, sent to the children that own its shards.
// A refusal says why, in its error and in /events (see reject.go).
func (t *Tree) ctl(line string) error {
	err := t.command(line)
	if err != nil && !logged(err) {
		t.refuse(nil, line, err)
	}
	return err
}

func (t *Tree) command(line string) error {
	words := strings.Fields(line)
	if len(words) > 0 && words[0] == "restart" {
		if len(words) != 2 {
			return fmt.Errorf("%w: %q: usage: %s", fs.ErrInvalid, line, strings.TrimSpace(RestartUsage))
		}
		var err error
		if words[1] == "all" {
			err = t.cfg.Supervisor.RestartAll()
		} else {
			err = t.cfg.Supervisor.Restart(words[1])
		}
		switch {
		case errors.Is(err, ErrUnknownChild):
			return fmt.Errorf("%w: %w", fs.ErrInvalid, err)
		case errors.Is(err, ErrBusy), errors.Is(err, ErrClosed):
			return fmt.Errorf("%w: %w", fsrv.ErrBusy, err)
		}
		return err
	}
	if len(words) > 0 && words[0] == "reshard" {
		// Each child runs a block of the plan; a move would need every
		// block of the new plan started together (DESIGN 7.5, README).
		return fmt.Errorf("%w: %q: supervise does not move to a larger plan yet: stop it and start it again with the new --total", fsrv.ErrBusy, line)
	}
	c, err := core.ParseCommand(line)
	if err != nil {
		var ce *core.CommandError
		if errors.As(err, &ce) && ce.Usage == core.NodeUsage {
			ce.Usage = Usage // restart too
		}
		return fmt.Errorf("%w: %w", fs.ErrInvalid, err)
	}
	per := map[int][]int{}
	if !c.All {
		for _, id := range c.Shards {
			sl := t.shards[id]
			if sl == nil {
				return fmt.Errorf("%w: shard %d is not in any child's block", fs.ErrInvalid, id)
			}
			per[sl.owner] = append(per[sl.owner], id)
		}
	}
	var errs []error
	for i, blk := range t.cfg.Assignment.Blocks {
		sub := c
		if !c.All {
			if per[i] == nil {
				continue
			}
			sub.Shards = per[i]
		}
		if err := t.forward(i, nil, "ctl", sub.String()); err != nil {
			if cr := (*childRefusal)(nil); !errors.As(err, &cr) {
				err = &loggedRefusal{fmt.Errorf("child %s: %w", blk.ID, err)} // a childRefusal names it
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var readBufs = sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}

// read reads a file of child i's tree.
func (t *Tree) read(i int, path string) ([]byte, error) {
	var out []byte
	err := t.call(i, func(root p9.File) error {
		f, err := walkTo(root, path)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			return err
		}
		bp := readBufs.Get().(*[]byte)
		defer readBufs.Put(bp)
		buf := *bp
		for off := int64(0); ; {
			n, err := f.ReadAt(buf, off)
			out = append(out, buf[:n]...)
			off += int64(n)
			// A short read is the end: a child's files are fixed at
			// open, and 8 KiB is below any msize.
			if err != nil && err != io.EOF {
				return err
			}
			if n < len(buf) || err == io.EOF {
				return nil
			}
		}
	})
	return out, err
}

// call runs f against child i's root within the timeout. A child that is
// not running is busy; one that does not answer in time loses its
// connection (the next call dials again). No lock is held while the
// child is dialled or asked: a hung child delays its own files only.
func (t *Tree) call(i int, f func(root p9.File) error) error {
	id := t.cfg.Assignment.Blocks[i].ID
	info := t.cfg.Supervisor.Child(i)
	if info.State != Running || info.Socket == "" {
		return fmt.Errorf("%w: child %s is %s", fsrv.ErrBusy, id, info.State)
	}
	deadline := time.Now().Add(t.cfg.Timeout)
	cc, err := t.client(i, info.Socket, info.Generation, deadline)
	if err != nil {
		return fmt.Errorf("%w: child %s: %v", fsrv.ErrBusy, id, err)
	}
	done := make(chan error, 1)
	go func() { done <- f(cc.root) }()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case err = <-done:
		var errno linux.Errno
		if err != nil && !errors.As(err, &errno) {
			t.drop(i, cc) // the connection failed, not the request
		}
	case <-timer.C:
		t.drop(i, cc)
		<-done // closing the connection ends the request
		return fmt.Errorf("%w: child %s did not answer within %v", fsrv.ErrBusy, id, t.cfg.Timeout)
	}
	return errnoToFS(err)
}

// client returns the connection to child i's generation gen, dialling it
// (connect, version and attach, all before deadline) when there is none.
// Two callers may dial at once: the first to finish keeps its connection.
func (t *Tree) client(i int, socket string, gen int, deadline time.Time) (*childClient, error) {
	slot := t.conns[i]
	slot.mu.Lock()
	cc := slot.cc
	if cc != nil && (cc.socket != socket || cc.gen != gen) {
		slot.cc = nil
		go cc.close()
		cc = nil
	}
	slot.mu.Unlock()
	if cc != nil {
		return cc, nil
	}
	cc, err := dialChild(socket, gen, deadline)
	if err != nil {
		return nil, err
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if have := slot.cc; have != nil && have.socket == socket && have.gen == gen {
		go cc.close()
		return have, nil
	}
	if slot.cc != nil {
		go slot.cc.close()
	}
	slot.cc = cc
	return cc, nil
}

// dialChild connects to a child's tree. A stopped child's socket still
// accepts into its backlog and never answers the version: the deadline on
// the connection bounds the handshake.
func dialChild(socket string, gen int, deadline time.Time) (*childClient, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(deadline)
	cl, err := p9.NewClient(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	root, err := cl.Attach("")
	if err != nil {
		conn.Close()
		cl.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return &childClient{socket: socket, gen: gen, conn: conn, client: cl, root: root}, nil
}

func (t *Tree) drop(i int, cc *childClient) {
	slot := t.conns[i]
	slot.mu.Lock()
	if slot.cc == cc {
		slot.cc = nil
	}
	slot.mu.Unlock()
	cc.close()
}

func (cc *childClient) close() {
	cc.conn.Close() // ends the calls in flight
	cc.client.Close()
}

// Close closes the connections to the children.
func (t *Tree) Close() {
	for _, slot := range t.conns {
		slot.mu.Lock()
		cc := slot.cc
		slot.cc = nil
		slot.mu.Unlock()
		if cc != nil {
			cc.close()
		}
	}
}

func walkTo(root p9.File, path string) (p9.File, error) {
	_, f, err := root.Walk(strings.Split(path, "/"))
	return f, err
}

// errnoToFS gives a child's errno back the kind fsrv turns into the same
// errno for the parent's client.
func errnoToFS(err error) error {
	var errno linux.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case linux.EINVAL:
		return fmt.Errorf("%w: the child refused it (its events say why)", fs.ErrInvalid)
	case linux.EACCES, linux.EPERM:
		return fs.ErrPermission
	case linux.ENOENT:
		return fs.ErrNotExist
	case linux.EBUSY:
		return fmt.Errorf("%w: the child is busy", fsrv.ErrBusy)
	}
	return err
}
