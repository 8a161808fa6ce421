package shardfs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
)

// Config configures a Tree. Node is required.
type Config struct {
	Scheduler *core.Scheduler
	// Info adds key value lines to /plan after the ones the core knows
	// (flavor, total, shards), e.g. gateway and max_concurrency. It is
	// called at every open of /plan.
	Info func() [][2]string
	// Identify, when set, gives the identify budget that /identify and the
	// metric shardfs_identify_remaining show (the node's pacer's Budget).
	Identify func() core.Budget
	// LeaseBackend names the lease backend in /lease ("local" when empty).
	LeaseBackend string
	// Lease, when set, is the content of /lease instead of the local
	// lease's summary (etcd: backend, node, ttl, deadline, remaining).
	Lease func() []byte

	// DispatchRetention and NodeDispatchRetention bound each shard's
	// dispatch log and the node's, in bytes (defaults 256 KiB and 16 MiB).
	DispatchRetention, NodeDispatchRetention int
	// Registry receives the tree's collector; nil makes a private one with
	// the Go runtime and process collectors.
	Registry *prometheus.Registry
	Logger   *slog.Logger

	// Dispatch, when set, is the node's dispatch log (/dispatch) to write
	// into, so that the tree of a plan that replaces another carries on
	// the same log and a reader's offsets stay good; nil means a new one
	// of NodeDispatchRetention bytes.
	Dispatch *journal.Merged
	// Files are more files at the root, after the standard ones.
	Files []fsrv.File
	// Command, when set, sees every node command first (a line written to
	// /ctl): handled false passes it on to the core. A refusal is logged
	// to the node's events as the core's are (core.Scheduler.Reject), so
	// the hook logs none itself. CommandUsage is added to /ctl's usage.
	Command      func(line string) (handled bool, err error)
	CommandUsage string
}

// Tree is the file tree of one node.
type Tree struct {
	node  *core.Scheduler
	cfg   Config
	root  *fsrv.Dir
	top   []fsrv.File
	reg   *prometheus.Registry
	local map[int]*shardFiles // fixed after New; files built on first use

	dispatch       *journal.Merged // the lines of the shards' dispatch logs
	dispatchEvents atomic.Uint64
	dispatchBytes  atomic.Uint64
	linePool       sync.Pool
	events         *eventSeconds
}

// shardFiles holds one shard's dispatch log (always, since the gateway
// writes to it) and its directory (once somebody looks).
type shardFiles struct {
	id       int
	dispatch *journal.Log
	once     sync.Once
	dir      *fsrv.Dir
}

// New builds the tree of cfg.Node.
func New(cfg Config) *Tree {
	t := &Tree{node: cfg.Scheduler, cfg: cfg, local: map[int]*shardFiles{}}
	if cfg.LeaseBackend == "" {
		t.cfg.LeaseBackend = "local"
	}
	t.dispatch = cfg.Dispatch
	if t.dispatch == nil {
		t.dispatch = journal.NewMerged(orDefault(cfg.NodeDispatchRetention, 16<<20))
	}
	per := orDefault(cfg.DispatchRetention, 256<<10)
	for _, id := range cfg.Scheduler.Plan().Local {
		t.local[id] = &shardFiles{id: id, dispatch: journal.New(per)}
	}
	t.reg = cfg.Registry
	if t.reg == nil {
		t.reg = newRegistry()
	}
	t.events = newEventSeconds()
	t.reg.MustRegister(&collector{t: t}, t.events.vec)
	t.top = []fsrv.File{
		&fsrv.Ctl{Name: "ctl", Path: "ctl", Handle: t.nodeCommand, Usage: func() string { return core.NodeUsage + cfg.CommandUsage }},
		&fsrv.LogFile{Name: "events", Source: t.node.Events()},
		&fsrv.Text{Name: "status", Content: t.status},
		&fsrv.Text{Name: "plan", Content: t.plan},
		&fsrv.Text{Name: "lease", Content: t.lease},
		&fsrv.Text{Name: "metrics", Content: t.metrics},
		&fsrv.LogFile{Name: "dispatch", Source: t.dispatch, Private: true},
	}
	if cfg.Identify != nil {
		t.top = append(t.top, &fsrv.Text{Name: "identify", Content: t.identify})
	}
	t.top = append(t.top, cfg.Files...)
	t.root = &fsrv.Dir{Name: "/", List: t.list, Lookup: t.lookup}
	return t
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// nodeCommand runs one line written to /ctl.
func (t *Tree) nodeCommand(line string) error {
	if t.cfg.Command != nil {
		if handled, err := t.cfg.Command(line); handled {
			if err != nil {
				t.node.Reject(line, err)
			}
			return fsError(err)
		}
	}
	if t.cfg.CommandUsage == "" {
		return fsError(t.node.ExecNode(line))
	}
	// ExecNode, with the usage of a refusal naming the commands the hook
	// adds (reshard, drain) too, since /ctl takes them.
	c, err := core.ParseCommand(line)
	var ce *core.CommandError
	if errors.As(err, &ce) && ce.Usage == core.NodeUsage {
		ce.Usage += t.cfg.CommandUsage
	}
	if err == nil {
		err = t.node.Apply(c)
	}
	if err != nil {
		t.node.Reject(line, err)
	}
	return fsError(err)
}

// Root returns the root directory, to serve with fsrv.Server.
func (t *Tree) Root() *fsrv.Dir { return t.root }

// Registry returns the Prometheus registry behind /metrics.
func (t *Tree) Registry() *prometheus.Registry { return t.reg }

// list shows the node files and the shards this node owns: a candidate
// shard that another node owns (etcd) is left out of the listing, and its
// directory is still reachable by name (cat 7/state says STOPPED and its
// diag stop_reason "not owned").
func (t *Tree) list() []fsrv.File {
	out := append([]fsrv.File(nil), t.top...)
	for _, d := range t.node.Snapshot(make([]core.Diag, 0, len(t.local))) {
		if d.Owned() {
			out = append(out, t.shardDir(t.local[d.Shard]))
		}
	}
	return out
}

func (t *Tree) lookup(name string) fsrv.File {
	return LookupTop(t.top, name, func(id int) fsrv.File {
		if sf := t.local[id]; sf != nil {
			return t.shardDir(sf)
		}
		return nil
	})
}

// LookupTop is what a tree root's Lookup does: the entry of top called
// name, else, when name is a shard number as the tree lists it (no sign,
// no leading zero), what shard returns for it, else nil.
func LookupTop(top []fsrv.File, name string, shard func(id int) fsrv.File) fsrv.File {
	for _, n := range top {
		if fsrv.FileName(n) == name {
			return n
		}
	}
	id, err := strconv.Atoi(name)
	if err != nil || strconv.Itoa(id) != name {
		return nil
	}
	return shard(id)
}

func (t *Tree) shardDir(sf *shardFiles) *fsrv.Dir {
	sf.once.Do(func() {
		id := sf.id
		events, _ := t.node.ShardEvents(id)
		sf.dir = fsrv.NewDir(strconv.Itoa(id),
			&fsrv.Text{Name: "state", Content: func() []byte { return t.word(id, stateWord) }},
			&fsrv.Text{Name: "sequence", Content: func() []byte { return t.word(id, sequenceWord) }},
			&fsrv.Text{Name: "reconnects", Content: func() []byte { return t.word(id, reconnectsWord) }},
			&fsrv.Ctl{Name: "ctl", Path: strconv.Itoa(id) + "/ctl", Handle: func(line string) error { return fsError(t.node.ExecShard(id, line)) }, Usage: func() string { return core.ShardUsage }},
			&fsrv.LogFile{Name: "events", Source: events},
			&fsrv.Text{Name: "diag", Content: func() []byte { return t.diag(id) }},
			&fsrv.LogFile{Name: "dispatch", Source: sf.dispatch, Private: true},
			&fsrv.Ctl{Name: "send", Path: strconv.Itoa(id) + "/send", Handle: func(line string) error { return fsError(t.node.Send(id, sendPayload(line))) }, Raw: true, Private: true},
		)
	})
	return sf.dir
}

// sendPayload is the payload of a line written to N/send. The gateway's
// size limit counts the bytes as written, white space included: a line
// over it is passed on whole, for Send to refuse and log; any other is
// trimmed.
func sendPayload(line string) []byte {
	if len(line) > core.MaxPayload {
		return []byte(line)
	}
	return []byte(strings.TrimSpace(line))
}

// Dispatch writes one dispatch to the shard's dispatch log and the node's.
// It is the gateway's sink: d is the raw JSON of the payload's d field and
// is not kept after the call; a negative seq (RESUMED) is written as null,
// and so is an empty session key (core.SessionKey).
func (t *Tree) Dispatch(shard int, session string, seq int64, typ string, d []byte) {
	sf := t.local[shard]
	if sf == nil {
		return
	}
	bp, _ := t.linePool.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b := append((*bp)[:0], `{"shard":`...)
	b = strconv.AppendInt(b, int64(shard), 10)
	b = append(b, `,"s":`...)
	if seq < 0 { // RESUMED and other dispatches without a sequence
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, seq, 10)
	}
	b = append(b, `,"t":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"session":`...)
	if session == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, session)
	}
	b = append(b, `,"d":`...)
	switch {
	case len(d) == 0:
		b = append(b, "null"...)
	case bytes.IndexByte(d, '\n') >= 0:
		// One object a line: a gateway that pretty-prints loses its layout.
		var c bytes.Buffer
		if json.Compact(&c, d) == nil {
			b = append(b, c.Bytes()...)
		} else {
			b = append(b, "null"...)
		}
	default:
		b = append(b, d...)
	}
	b = append(b, "}\n"...)
	now := t.node.Clock().Now()
	_, line := sf.dispatch.AppendLine(b, now)
	t.dispatch.Add(line, now) // the same bytes: one copy for both files
	t.dispatchEvents.Add(1)
	t.dispatchBytes.Add(uint64(len(b)))
	*bp = b
	t.linePool.Put(bp)
}

// appendJSONString quotes s for JSON. Event names are upper-case ASCII and
// take the fast path.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// DispatchCount returns the number of dispatches written to the dispatch
// logs so far.
func (t *Tree) DispatchCount() uint64 { return t.dispatchEvents.Load() }

// DispatchLog returns the dispatch log of one shard, or nil.
func (t *Tree) DispatchLog(shard int) *journal.Log {
	if sf := t.local[shard]; sf != nil {
		return sf.dispatch
	}
	return nil
}

// NodeDispatchLog returns the node's dispatch log.
func (t *Tree) NodeDispatchLog() *journal.Merged { return t.dispatch }

type wordKind int

const (
	stateWord wordKind = iota
	sequenceWord
	reconnectsWord
)

var stateLines = func() (m [8][]byte) {
	for s := core.Assigned; s <= core.Stopped; s++ {
		m[s] = []byte(s.String() + "\n")
	}
	return m
}()

func (t *Tree) word(id int, k wordKind) []byte {
	d, err := t.node.Diag(id)
	if err != nil {
		return []byte("none\n")
	}
	switch k {
	case stateWord:
		return stateLines[d.State]
	case sequenceWord:
		if !d.SequenceValid {
			return []byte("none\n")
		}
		return append(strconv.AppendInt(make([]byte, 0, 12), d.Sequence, 10), '\n')
	}
	return append(strconv.AppendUint(make([]byte, 0, 12), d.Reconnects, 10), '\n')
}

func (t *Tree) diag(id int) []byte {
	d, err := t.node.Diag(id)
	if err != nil {
		return nil
	}
	return d.AppendText(make([]byte, 0, 768), t.node.Clock().Now())
}

func (t *Tree) status() []byte {
	diags := t.node.Snapshot(make([]core.Diag, 0, len(t.local)))
	b := make([]byte, 0, len(diags)*32)
	for _, d := range diags {
		if !d.Owned() {
			continue // a candidate another node owns (see list)
		}
		b = strconv.AppendInt(b, int64(d.Shard), 10)
		b = append(b, ' ')
		b = append(b, d.State.String()...)
		b = append(b, ' ')
		if d.SequenceValid {
			b = strconv.AppendInt(b, d.Sequence, 10)
		} else {
			b = append(b, "none"...)
		}
		b = append(b, ' ')
		b = strconv.AppendUint(b, d.Reconnects, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, d.Latency.Milliseconds(), 10)
		b = append(b, '\n')
	}
	return b
}

func (t *Tree) plan() []byte {
	p := t.node.Plan()
	var b strings.Builder
	fmt.Fprintf(&b, "flavor %s\ntotal %d\nshards %s\ncount %d\n", t.node.Flavor(), p.Total, FormatShardList(p.Local), len(p.Local))
	if t.cfg.Info != nil {
		for _, kv := range t.cfg.Info() {
			fmt.Fprintf(&b, "%s %s\n", kv[0], kv[1])
		}
	}
	return []byte(b.String())
}

// identify is /identify (DESIGN.md section 7.2).
func (t *Tree) identify() []byte { return FormatIdentify(t.cfg.Identify(), t.node.Clock().Now()) }

// FormatIdentify is the content of /identify for budget b at now. A total
// not known yet (no discovery answer so far) shows as unknown, like every
// figure that depends on it.
func FormatIdentify(bg core.Budget, now time.Time) []byte {
	var b strings.Builder
	ms := func(k string, at time.Time) {
		if at.IsZero() {
			fmt.Fprintf(&b, "%s none\n", k)
		} else {
			fmt.Fprintf(&b, "%s %d\n", k, max(at.Sub(now), 0).Milliseconds())
		}
	}
	if bg.Total == 0 {
		b.WriteString("total unknown\nremaining unknown\n")
	} else {
		fmt.Fprintf(&b, "total %d\nremaining %d\n", bg.Total, bg.Remaining)
	}
	if bg.ResetAt.IsZero() {
		b.WriteString("reset_at none\n")
	} else {
		fmt.Fprintf(&b, "reset_at %s\n", bg.ResetAt.UTC().Format(time.RFC3339))
	}
	ms("reset_in_ms", bg.ResetAt)
	fmt.Fprintf(&b, "used_24h %d\nreserve %d\nmax_concurrency %d\nwaiting %d\n", bg.Used24h, bg.Reserve, bg.MaxConcurrency, bg.Waiting)
	ms("next_slot_ms", bg.NextSlot)
	return []byte(b.String())
}

func (t *Tree) lease() []byte {
	if t.cfg.Lease != nil {
		return t.cfg.Lease()
	}
	now := t.node.Clock().Now()
	var armed, expired int
	var gen uint64
	var deadline time.Time
	for _, d := range t.node.Snapshot(nil) {
		gen = max(gen, d.Lease.Generation)
		if d.Lease.Deadline.IsZero() {
			continue
		}
		armed++
		if d.LeaseExpired || !now.Before(d.Lease.Deadline) {
			expired++
		} else if deadline.IsZero() || d.Lease.Deadline.Before(deadline) {
			deadline = d.Lease.Deadline
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "backend %s\narmed %d\nexpired %d\ngeneration %d\n", t.cfg.LeaseBackend, armed, expired, gen)
	if deadline.IsZero() {
		b.WriteString("deadline none\nremaining none\n")
	} else {
		fmt.Fprintf(&b, "deadline %s\nremaining %s\n", deadline.UTC().Format(time.RFC3339Nano), deadline.Sub(now).Round(time.Millisecond))
	}
	return []byte(b.String())
}

// FormatShardList writes sorted IDs as ranges: 0-3,7.
func FormatShardList(ids []int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ids[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ids[j]))
		}
		i = j + 1
	}
	return b.String()
}

// fsError turns the core's errors into the kinds fsrv converts to 9P
// errors, keeping the message.
func fsError(err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := err.(*core.CommandError); ok && len(ce.Word) > maxErrWord {
		// The word comes first in the error and can be the whole junk
		// line; under 9P2000 the string is cut at 127 bytes (ERRMAX),
		// and the reason after the word must survive that.
		short := *ce
		short.Word = refusal.Clip(ce.Word, maxErrWord)
		err = &short
	}
	var kind error
	switch {
	case errors.Is(err, core.ErrTooLarge):
		kind = fsrv.ErrTooLarge
	case errors.Is(err, core.ErrBusy):
		kind = fsrv.ErrBusy
	case errors.Is(err, core.ErrUsage), errors.Is(err, core.ErrUnknownShard), errors.Is(err, core.ErrNoLease):
		kind = fs.ErrInvalid
	default:
		return err
	}
	return &kindError{err: err, kind: kind}
}

// maxErrWord bounds the quoted word of a refused command in a write's
// error.
const maxErrWord = 32

type kindError struct{ err, kind error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
