package core_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
)

// junkLine returns n bytes without a newline, from every kind that needs
// quoting or escaping in logfmt: controls, quotes, invalid UTF-8, long
// runes.
func junkLine(rng *rand.Rand, n int) string {
	alphabet := []string{"x", " ", `"`, `\`, "=", "\x00", "\x01", "\x7f", "\xff", "\xc3", "é", "\u2028", "𝄞", "reset", "lease"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return strings.ReplaceAll(b.String(), "\n", "")
}

// 3 MB of junk written to a shard's ctl, the node's ctl and a shard's send
// file must not push the lines that explain a failure out of the events
// logs, nor flood the logger: every refusal line is bounded, refusals past
// a burst are counted and summed up in one line once the window ends, and
// the next window logs again.
func TestRejectionsBounded(t *testing.T) {
	out := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(out, nil))
	e := newEnv(t, core.Config{Logger: log})
	e.startAll()
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("the failure to explain"), Code: 4000})
	e.clk.Advance(5 * time.Second)
	e.conn(0).Link.Resumed(2)
	shardLog, _ := e.node.ShardEvents(0)
	shardBefore, nodeBefore, slogBefore := shardLog.Size(), e.node.Events().Size(), out.Len()

	rng := rand.New(rand.NewPCG(1, 2))
	written, refused := 0, map[int]int{}
	for written < 3<<20 {
		line := junkLine(rng, 200+rng.IntN(4000))
		switch rng.IntN(50) {
		case 0:
			line = "frobnicate " + junkLine(rng, 200_000)
		case 1: // one word, which the error quotes whole
			line = strings.Repeat("\x01x\"\xff", 50_000)
		}
		written += len(line)
		var err error
		switch id := rng.IntN(10); {
		case id < 8:
			err = e.node.ExecShard(0, line)
			refused[0]++
		case id == 8:
			err = e.node.ExecNode(line)
			refused[-1]++
		default:
			err = e.node.Send(0, []byte(line))
			refused[0]++
		}
		if err == nil {
			t.Fatalf("junk %.40q accepted", line)
		}
	}
	if got := e.diag(0).State; got != core.Ready {
		t.Fatalf("shard 0 is %v after the junk; want READY", got)
	}

	shardLogged := shardLog.Size() - shardBefore
	nodeLogged := e.node.Events().Size() - nodeBefore
	slogged := out.Len() - slogBefore
	t.Logf("%d bytes of junk in %d refusals: %d bytes logged to shard 0, %d to the node, %d to the logger",
		written, refused[0]+refused[-1], shardLogged, nodeLogged, slogged)
	if shardLogged > 8<<10 || nodeLogged > 16<<10 || slogged > 32<<10 {
		t.Errorf("%d bytes of junk in %d refusals logged %d bytes to shard 0, %d to the node, %d to the logger; want a few KiB",
			written, refused[0]+refused[-1], shardLogged, nodeLogged, slogged)
	}
	ev := e.events(0)
	if shardLog.Oldest() != 0 || !strings.Contains(ev, "the failure to explain") {
		t.Fatalf("the failure's line is gone from shard 0's events (oldest offset %d)", shardLog.Oldest())
	}
	lines := rejectedLines(ev)
	if len(lines) == 0 {
		t.Fatal("no refusal logged at all")
	}
	for _, l := range lines {
		if len(l) > 256 || !utf8.ValidString(l) {
			t.Errorf("refusal line of %d bytes (valid UTF-8 %v); want at most 256: %q", len(l), utf8.ValidString(l), l)
		}
	}
	if strings.Contains(ev, "suppressed=") {
		t.Errorf("a summary before the window ended:\n%s", ev)
	}

	// The window ends: one line says how many refusals went unlogged.
	e.clk.Advance(time.Minute)
	for _, id := range []int{0, -1} {
		want := refused[id] - len(rejectedLines(eventsOf(t, e, id)))
		sum := summaries(eventsOf(t, e, id), id)
		if len(sum) != 1 || sum[0] != want {
			t.Errorf("shard %d: suppressed summaries %v; want one of %d", id, sum, want)
		}
	}

	// The next window logs refusals again.
	before := len(rejectedLines(e.events(0)))
	if err := e.node.ExecShard(0, "frobnicate"); !errors.Is(err, core.ErrUsage) {
		t.Fatalf("frobnicate = %v; want ErrUsage", err)
	}
	if after := rejectedLines(e.events(0)); len(after) != before+1 || !strings.HasSuffix(after[len(after)-1], ` event=rejected cmd=? len=10 err="unknown command"`) {
		t.Errorf("a refusal after the window is not logged: %q", after[len(after)-1])
	}
}

// eventsOf returns shard id's events, or the node's lines of its own ctl
// (those without a shard key) when id is -1.
func eventsOf(t *testing.T, e *env, id int) string {
	if id >= 0 {
		return e.events(id)
	}
	l := e.node.Events()
	buf := make([]byte, l.Size()-l.Oldest())
	n, _ := l.ReadAt(buf, l.Oldest())
	var own []string
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if line != "" && !strings.Contains(line, " shard=") {
			own = append(own, line)
		}
	}
	return strings.Join(own, "\n")
}

func rejectedLines(ev string) []string {
	var out []string
	for _, l := range strings.Split(ev, "\n") {
		if strings.Contains(l, " event=rejected ") {
			out = append(out, l)
		}
	}
	return out
}

// summaries returns the suppressed=K counts of the summary lines.
func summaries(ev string, id int) []int {
	var out []int
	for _, l := range strings.Split(ev, "\n") {
		key := " shard=" + strconv.Itoa(id)
		if id < 0 {
			key = "" // a node-level line names no shard
		}
		_, rest, ok := strings.Cut(l, key+" event=rejected-suppressed suppressed=")
		if !ok {
			continue
		}
		k, _, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(k)
		if err != nil {
			n = -1
		}
		out = append(out, n)
	}
	return out
}

// Junk written without pause is logged in bursts whose windows double, up
// to an hour, so that it costs a few lines an hour; after a quiet window
// the next refusals get the one-minute window again.
func TestRejectionWindowGrows(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	refuse := func(n int) {
		for range n {
			if err := e.node.ExecShard(0, "frob"); err == nil {
				t.Fatal("frob accepted")
			}
		}
	}
	for range 4 * 360 { // 4 hours, 5 refusals every 10 s
		refuse(5)
		e.clk.Advance(10 * time.Second)
	}
	ev := e.events(0)
	var windows []string
	for _, l := range strings.Split(ev, "\n") {
		if _, w, ok := strings.Cut(l, "event=rejected-suppressed "); ok {
			_, w, _ = strings.Cut(w, " window=")
			windows = append(windows, w)
		}
	}
	want := []string{"1m0s", "2m0s", "4m0s", "8m0s", "16m0s", "32m0s", "1h0m0s", "1h0m0s"}
	if !slices.Equal(windows, want) {
		t.Errorf("summary windows %v; want %v", windows, want)
	}
	if n := len(rejectedLines(ev)); n != 10*(len(windows)+1) {
		t.Errorf("%d refusal lines in 4 hours; want %d, a burst of 10 per window", n, 10*(len(windows)+1))
	}

	e.clk.Advance(3 * time.Hour)
	refuse(11)
	e.clk.Advance(time.Minute)
	if last := e.lastEvent(0); !strings.HasSuffix(last, "event=rejected-suppressed suppressed=1 window=1m0s") {
		t.Errorf("after a quiet window the last line is %q; want one suppressed in a window of 1m0s", last)
	}
}

// A refusal on the node's ctl is a node-level line: it names no shard
// (no shard=-1), and Reject, for commands outside the core, writes the
// same line.
func TestNodeRejectionNamesNoShard(t *testing.T) {
	e := newEnv(t, core.Config{})
	if err := e.node.ExecNode("frob all"); !errors.Is(err, core.ErrUsage) {
		t.Fatalf("ExecNode(frob all) = %v; want ErrUsage", err)
	}
	e.node.Reject("drain now", fmt.Errorf("%w: drain takes no argument, got %q", core.ErrUsage, "now"))
	lines := rejectedLines(eventsOf(t, e, -1))
	if len(lines) != 2 {
		t.Fatalf("node-level rejected lines = %q; want 2", lines)
	}
	for _, l := range lines {
		if strings.Contains(l, "shard=") {
			t.Errorf("node-level line %q names a shard", l)
		}
	}
	if want := `event=rejected cmd=drain len=9 err="invalid argument: drain takes no argument, got \"...\""`; !strings.HasSuffix(lines[1], want) {
		t.Errorf("Reject's line = %q; want it to end %s", lines[1], want)
	}
}

// Junk written to every shard's ctl at once is bounded node-wide too:
// the node's events get at most refusal.NodeBurst refusal lines a window
// from all shards together (1,024 shards once put about 42 MB a minute
// into the node's events), while each shard's own events still explain
// its refusals.
func TestRejectionsBoundedNodeWide(t *testing.T) {
	const shards = 256
	e := newEnv(t, core.Config{Plan: core.Range(shards, 0, shards-1)})
	nodeBefore := e.node.Events().Size()
	for range 20 {
		for id := range shards {
			if err := e.node.ExecShard(id, "frob "+strings.Repeat("x", 1000)); err == nil {
				t.Fatal("frob accepted")
			}
		}
	}
	if n := len(rejectedLines(eventsSince(e.node.Events(), nodeBefore))); n != refusal.NodeBurst {
		t.Errorf("%d refusal lines in the node's events from %d shards; want the node-wide burst of %d", n, shards, refusal.NodeBurst)
	}
	for id := range shards {
		if n := len(rejectedLines(e.events(id))); n != refusal.Burst {
			t.Fatalf("shard %d's events have %d refusal lines; want its burst of %d", id, n, refusal.Burst)
		}
	}
	// The windows end: each shard's events sum up its own; the node's
	// take summaries within its budget and sum up the rest.
	e.clk.Advance(time.Minute)
	for id := range shards {
		if sum := summaries(e.events(id), id); len(sum) != 1 || sum[0] != 10 {
			t.Fatalf("shard %d's summaries %v; want one of 10", id, sum)
		}
	}
	e.clk.Advance(time.Minute)
	ev := eventsSince(e.node.Events(), nodeBefore)
	lines := strings.Count(ev, "\n")
	nodeWide := strings.Count(ev, "event=rejected-suppressed scope=node ")
	if nodeWide < 1 || lines > 3*refusal.NodeBurst {
		t.Errorf("the node's events: %d lines, %d node-wide summaries; want at most %d lines and a node-wide summary", lines, nodeWide, 3*refusal.NodeBurst)
	}
	t.Logf("%d refusals on %d shards: %d lines, %d bytes in the node's events in two minutes", 20*shards, shards, lines, len(ev))
}

// A refused line's content never reaches the events or the logger: a
// resume carrying the token written to send, a token pasted into ctl.
func TestRejectionHidesContent(t *testing.T) {
	out := &syncBuffer{}
	e := newEnv(t, core.Config{Logger: slog.New(slog.NewTextHandler(out, nil))})
	e.startAll()
	e.clk.Advance(5 * time.Second)
	const secret = "MTk4NjIyNDgzNDcxOTI1MjQ4.Gxyz.SECRETSECRETSECRET"
	for _, try := range []func() error{
		func() error {
			return e.node.Send(0, []byte(`{"op":6,"d":{"token":"`+secret+`","session_id":"x","seq":1}}`))
		},
		func() error { return e.node.Send(0, []byte(`{"op":"`+secret+`"}`)) },
		func() error { return e.node.Send(0, []byte(secret)) },
		func() error { return e.node.ExecShard(0, secret) },
		func() error { return e.node.ExecShard(0, "reset "+secret) },
		func() error { return e.node.ExecNode("lease " + secret) },
		func() error { return e.node.ExecNode("reset " + secret) },
		func() error {
			e.node.Reject("drain "+secret, fmt.Errorf("drain takes no argument, got %q", secret))
			return errors.New("")
		},
	} {
		if err := try(); err == nil {
			t.Fatal("a secret was accepted as a command")
		}
	}
	all := eventsSince(e.node.Events(), 0) + out.String()
	if strings.Contains(all, "SECRET") || strings.Contains(all, "MTk4") {
		t.Errorf("a refused line's content was logged:\n%s", all)
	}
	if n := len(rejectedLines(eventsSince(e.node.Events(), 0))); n != 8 {
		t.Errorf("%d refusal lines; want 8", n)
	}
	if !strings.Contains(eventsSince(e.node.Events(), 0), " cmd=send op=6 len=") {
		t.Error("the refused resume is not logged by its op")
	}
}

func eventsSince(l *journal.Log, from int64) string {
	from = max(from, l.Oldest())
	buf := make([]byte, l.Size()-from)
	n, _ := l.ReadAt(buf, from)
	return string(buf[:n])
}
