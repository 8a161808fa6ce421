package shardfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/fsrv/fsrvtest"
	"github.com/shardfs/shardfs/lease/local"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "s3cr3t-session"

// env is a tree over a node of fake shards, served in-process.
type env struct {
	t    *testing.T
	clk  *clock.Fake
	tr   *coretest.Transport
	node *core.Scheduler
	tree *Tree
	srv  *fsrv.Server
}

func newEnv(t *testing.T, opts ...func(*Config)) *env {
	e := &env{t: t, clk: clock.NewFake(), tr: &coretest.Transport{}}
	n, err := core.New(core.Config{
		Plan: core.Range(8, 0, 3), Transport: e.tr, Clock: e.clk, Lease: local.New(e.clk),
		Backoff: core.Fixed(5 * time.Second), Pacer: core.NewDiscordPacer(e.clk, 16),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.node = n
	cfg := Config{Scheduler: n, Info: func() [][2]string {
		return [][2]string{{"gateway", "wss://gateway.example"}, {"max_concurrency", "16"}}
	}}
	for _, o := range opts {
		o(&cfg)
	}
	e.tree = New(cfg)
	e.srv = &fsrv.Server{Root: e.tree.Root(), Clock: e.clk}
	t.Cleanup(func() { e.srv.Close(); n.Close() })
	n.Start()
	for id := range 4 {
		e.tr.Last(id).Link.Ready(core.Session{ID: secret}, 1)
	}
	return e
}

func (e *env) pipe() net.Conn {
	c, s := net.Pipe()
	go e.srv.ServeConn(context.Background(), s)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// dotl attaches with the hugelgupf/p9 client (9P2000.L).
func (e *env) dotl() p9.File {
	cl, err := p9.NewClient(e.pipe())
	if err != nil {
		e.t.Fatal(err)
	}
	root, err := cl.Attach("")
	if err != nil {
		e.t.Fatal(err)
	}
	return root
}

// plan9 attaches with 9fans.net/go's client (9P2000).
func (e *env) plan9() *client.Fsys {
	conn, err := client.NewConn(e.pipe())
	if err != nil {
		e.t.Fatal(err)
	}
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		e.t.Fatal(err)
	}
	return fsys
}

func readL(t *testing.T, root p9.File, path string) string {
	t.Helper()
	text, err := read(root, path)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// read reads a whole file; safe from any goroutine.
func read(root p9.File, path string) (string, error) {
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		return "", fmt.Errorf("walk %s: %w", path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	var out []byte
	buf := make([]byte, 8192)
	for off := int64(0); ; {
		n, err := f.ReadAt(buf, off)
		out = append(out, buf[:n]...)
		off += int64(n)
		if n == 0 || err == io.EOF {
			return string(out), nil
		}
		if err != nil {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
	}
}

func writeL(t *testing.T, root p9.File, path, text string) error {
	t.Helper()
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		t.Fatalf("walk %s: %v", path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return err
	}
	// Resend from a short count, as the kernel and write(2)'s callers do:
	// a ctl write that fails part-way reports the bytes applied.
	for off := 0; ; {
		n, err := f.WriteAt([]byte(text[off:]), int64(off))
		off += n
		if err != nil || off == len(text) {
			return err
		}
		if n == 0 {
			t.Fatalf("write %q to %s: no progress at %d", text, path, off)
		}
	}
}

func read9(t *testing.T, fsys *client.Fsys, path string) string {
	t.Helper()
	f, err := fsys.Open(path, plan9.OREAD)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func write9(fsys *client.Fsys, path, text string) error {
	f, err := fsys.Open(path, plan9.OWRITE|plan9.OTRUNC)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write([]byte(text))
	return err
}

func TestTreeAcceptance(t *testing.T) {
	// Without the runtime collectors /metrics holds still while the suite
	// reads it twice.
	e := newEnv(t, func(c *Config) { c.Registry = prometheus.NewRegistry() })
	fsrvtest.TestTree(t, e.tree.Root(), "ctl", "events", "status", "plan", "lease", "metrics", "dispatch",
		"0/state", "0/sequence", "0/reconnects", "0/ctl", "0/events", "0/diag", "0/dispatch", "3/state")
}

func TestShardFiles(t *testing.T) {
	e := newEnv(t)
	e.tr.Last(1).Link.Dispatch(42)
	e.tr.Last(2).Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("connection reset")})
	root := e.dotl()
	for _, tc := range []struct{ path, want string }{
		{"0/state", "READY\n"},
		{"2/state", "BACKOFF\n"},
		{"1/sequence", "42\n"},
		{"2/reconnects", "1\n"},
		{"status", "0 READY 1 0 0\n1 READY 42 0 0\n2 BACKOFF 1 1 0\n3 READY 1 0 0\n"},
		{"plan", "flavor discord\ntotal 8\nshards 0-3\ncount 4\ngateway wss://gateway.example\nmax_concurrency 16\n"},
		{"lease", "backend local\narmed 0\nexpired 0\ngeneration 0\ndeadline none\nremaining none\n"},
		{"ctl", core.NodeUsage},
		{"0/ctl", core.ShardUsage},
	} {
		if got := readL(t, root, tc.path); got != tc.want {
			t.Errorf("cat %s = %q; want %q", tc.path, got, tc.want)
		}
	}
	diag := readL(t, root, "2/diag")
	for _, want := range []string{"state BACKOFF\n", "retry_delay_ms 5000\n", `last_error "connection reset"` + "\n", "session resumable\n"} {
		if !strings.Contains(diag, want) {
			t.Errorf("2/diag lacks %q:\n%s", want, diag)
		}
	}
	if _, _, err := root.Walk([]string{"9"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("walk to shard 9 = %v; want ENOENT", err)
	}
	if _, _, err := root.Walk([]string{"03"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("walk to 03 = %v; want ENOENT", err)
	}
}

// Commands over both dialects, with the errors each dialect carries, and
// every rejection in the events log.
func TestCtl(t *testing.T) {
	e := newEnv(t)
	root := e.dotl()
	if err := writeL(t, root, "0/ctl", "reset\n"); err != nil {
		t.Fatalf("echo reset > 0/ctl: %v", err)
	}
	if got := readL(t, root, "0/reconnects"); got != "1\n" {
		t.Fatalf("0/reconnects after reset = %q; want 1", got)
	}
	if err := writeL(t, root, "0/ctl", "frobnicate\n"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("echo frobnicate > 0/ctl = %v; want EINVAL", err)
	}
	if ev := readL(t, root, "0/events"); !strings.Contains(ev, `event=rejected cmd=? len=10 err="unknown command"`) {
		t.Fatalf("0/events lacks the rejection:\n%s", ev)
	}
	if err := writeL(t, root, "ctl", "stop 1 2\nstart 1\nbogus\nstop 3\n"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("multi-line ctl with a bad third line = %v; want EINVAL", err)
	}
	for id, want := range []string{"STARTING\n", "STARTING\n", "STOPPED\n", "READY\n"} {
		if got := readL(t, root, string(rune('0'+id))+"/state"); got != want {
			t.Errorf("after the partial write %d/state = %q; want %q", id, got, want)
		}
	}
	if err := writeL(t, root, "2/ctl", "retry\n"); !errors.Is(err, linux.EBUSY) {
		t.Fatalf("retry on a stopped shard = %v; want EBUSY", err)
	}
	if err := writeL(t, root, "ctl", "reset 99\n"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("reset 99 = %v; want EINVAL", err)
	}
	if err := writeL(t, root, "0/state", "READY\n"); !errors.Is(err, linux.EACCES) {
		t.Fatalf("write to 0/state = %v; want EACCES", err)
	}

	fsys := e.plan9()
	if err := write9(fsys, "ctl", "lease 30s\n"); err != nil {
		t.Fatalf("9P2000 lease 30s: %v", err)
	}
	if got := read9(t, fsys, "lease"); !strings.Contains(got, "armed 4\nexpired 0\ngeneration 1\n") || !strings.Contains(got, "remaining 30s\n") {
		t.Fatalf("lease = %q", got)
	}
	err := write9(fsys, "3/ctl", "frob\n")
	if err == nil || !strings.HasPrefix(err.Error(), "invalid argument: ") || !strings.Contains(err.Error(), `"frob": unknown command`) {
		t.Fatalf("9P2000 frob = %v; want an error starting with invalid argument and naming the word", err)
	}
	if err := write9(fsys, "2/ctl", "retry\n"); err == nil || !strings.HasPrefix(err.Error(), "busy: ") {
		t.Fatalf("9P2000 retry on a stopped shard = %v; want busy: ...", err)
	}
	e.clk.Advance(31 * time.Second)
	if got := read9(t, fsys, "0/state"); got != "STOPPED\n" {
		t.Fatalf("after the lease expired 0/state = %q; want STOPPED", got)
	}
}

// openL opens path for writing with the 9P2000.L client; the test's
// cleanup clunks it.
func openL(t *testing.T, root p9.File, path string) p9.File {
	t.Helper()
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		t.Fatalf("walk %s: %v", path, err)
	}
	t.Cleanup(func() { f.Close() })
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return f
}

// TestCtlWriteContract: issue 21 items 9 and 10 on the real tree. A
// write that fails part-way reports the bytes applied, so that the resend
// starts at the bad line and the line before it runs once; a write
// without a newline is a whole command whose error the writer sees.
func TestCtlWriteContract(t *testing.T) {
	e := newEnv(t)
	root := e.dotl()
	f := openL(t, root, "ctl")
	// One Twrite, as the kernel sends `printf 'reset 1\nbogus\n' > ctl`.
	text := "reset 1\nbogus\n"
	if n, err := f.WriteAt([]byte(text), 0); n != len("reset 1\n") || err != nil {
		t.Fatalf("write %q = %d, %v; want %d, nil", text, n, err, len("reset 1\n"))
	}
	// The kernel resends from the short count at once, and that write
	// returns the bad line's error.
	if n, err := f.WriteAt([]byte("bogus\n"), 8); n != 0 || !errors.Is(err, linux.EINVAL) {
		t.Fatalf("resend of bogus = %d, %v; want 0, EINVAL", n, err)
	}
	// cat resends what is left once more (the kernel returned the short
	// count to it): the error again, and reset 1 has run once.
	if n, err := f.WriteAt([]byte("bogus\n"), 8); n != 0 || !errors.Is(err, linux.EINVAL) {
		t.Fatalf("second resend of bogus = %d, %v; want 0, EINVAL", n, err)
	}
	if got := readL(t, root, "1/reconnects"); got != "1\n" {
		t.Fatalf("1/reconnects = %q; want 1 (reset 1 applied once)", got)
	}

	// printf bogus > 1/ctl fails in both dialects.
	if err := writeL(t, root, "1/ctl", "bogus"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("printf bogus > 1/ctl (9P2000.L) = %v; want EINVAL", err)
	}
	fsys := e.plan9()
	if err := write9(fsys, "1/ctl", "bogus"); err == nil || !strings.HasPrefix(err.Error(), "invalid argument: ") {
		t.Fatalf("printf bogus > 1/ctl (9P2000) = %v; want invalid argument: ...", err)
	}
	if err := writeL(t, root, "1/ctl", "reset"); err != nil {
		t.Fatalf("printf reset > 1/ctl = %v; want nil", err)
	}
	// Under 9P2000 the reason comes within ERRMAX (127 bytes), however
	// long the bad word.
	err := write9(fsys, "1/ctl", strings.Repeat("z", 300)+"\n")
	if err == nil || len(err.Error()) > 127 || !strings.HasPrefix(err.Error(), "invalid argument: ") || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("9P2000 write of a 300-byte word = %q; want invalid argument, the reason, at most 127 bytes", err)
	}
	if got := readL(t, root, "1/reconnects"); got != "2\n" {
		t.Fatalf("1/reconnects = %q; want 2", got)
	}
}

// TestSendLimitAsWritten: issue 21 item 11. N/send's 4096 bytes count
// the line as written, white space included, and a longer line cut into
// 4 KiB writes (9pfuse) fails with an error, never a short count alone,
// and nothing of it is sent.
func TestSendLimitAsWritten(t *testing.T) {
	e := newEnv(t)
	root := e.dotl()
	payload := `{"op":3,"d":"` + strings.Repeat("x", core.MaxPayload-15) + `"}`
	if len(payload) != core.MaxPayload {
		t.Fatalf("payload of %d bytes", len(payload))
	}
	if err := writeL(t, root, "1/send", payload+"\n"); err != nil {
		t.Fatalf("send of %d bytes = %v; want nil", len(payload), err)
	}
	if err := writeL(t, root, "1/send", "  "+payload+"\n"); !errors.Is(err, linux.EFBIG) {
		t.Fatalf("send of %d bytes and two spaces = %v; want EFBIG", len(payload), err)
	}
	if sent := e.tr.Last(1).Sent(); len(sent) != 1 || string(sent[0]) != payload {
		t.Fatalf("gateway got %d commands; want the one of %d bytes", len(sent), len(payload))
	}

	big := `{"op":3,"d":"` + strings.Repeat("x", 5000) + `"}` + "\n"
	f := openL(t, root, "1/send")
	if n, err := f.WriteAt([]byte(big[:4096]), 0); n != 4096 || err != nil {
		t.Fatalf("first 4 KiB = %d, %v; want 4096, nil (its line goes on)", n, err)
	}
	if n, err := f.WriteAt([]byte(big[4096:]), 4096); n != 0 || !errors.Is(err, linux.EFBIG) {
		t.Fatalf("the rest = %d, %v; want 0, EFBIG", n, err)
	}
	// 9pfuse turns that into a short count; cat resends the rest.
	if n, err := f.WriteAt([]byte(big[4096:]), 4096); n != 0 || !errors.Is(err, linux.EFBIG) {
		t.Fatalf("the resent rest = %d, %v; want 0, EFBIG", n, err)
	}
	if sent := e.tr.Last(1).Sent(); len(sent) != 1 {
		t.Fatalf("gateway got %d commands; want still 1", len(sent))
	}
}

func TestSendAndDispatch(t *testing.T) {
	e := newEnv(t)
	root := e.dotl()
	if err := writeL(t, root, "1/send", `{"op":3,"d":{"status":"idle"}}`+"\n"); err != nil {
		t.Fatalf("send: %v", err)
	}
	if sent := e.tr.Last(1).Sent(); len(sent) != 1 || string(sent[0]) != `{"op":3,"d":{"status":"idle"}}` {
		t.Fatalf("gateway got %q", sent)
	}
	if err := writeL(t, root, "1/send", "not json\n"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("send of non-JSON = %v; want EINVAL", err)
	}
	big := `{"op":3,"d":"` + strings.Repeat("x", 5000) + `"}` + "\n"
	if err := writeL(t, root, "1/send", big); !errors.Is(err, linux.EFBIG) {
		t.Fatalf("send of 5 KB = %v; want EFBIG", err)
	}
	if ev := readL(t, root, "1/events"); strings.Count(ev, "event=rejected cmd=send ") != 2 || strings.Contains(ev, "xxx") {
		t.Fatalf("1/events lacks the two rejected sends:\n%s", ev)
	}
	if _, f, _ := root.Walk([]string{"1", "send"}); f != nil {
		if _, _, err := f.Open(p9.ReadOnly); !errors.Is(err, linux.EACCES) {
			t.Fatalf("open send for reading = %v; want EACCES", err)
		}
		f.Close()
	}

	e.tree.Dispatch(1, "a1b2c3d4e5f6", 2, "MESSAGE_CREATE", []byte(`{"content":"hi"}`))
	e.tree.Dispatch(3, "a1b2c3d4e5f6", 7, "GUILD_CREATE", []byte("{\n  \"id\": \"1\"\n}"))
	e.tree.Dispatch(1, "", -1, `WEIRD"TYPE`, nil) // no session yet: null
	want1 := `{"shard":1,"s":2,"t":"MESSAGE_CREATE","session":"a1b2c3d4e5f6","d":{"content":"hi"}}` + "\n" + `{"shard":1,"s":null,"t":"WEIRD\"TYPE","session":null,"d":null}` + "\n"
	if got := readL(t, root, "1/dispatch"); got != want1 {
		t.Fatalf("1/dispatch = %q; want %q", got, want1)
	}
	all := readL(t, root, "dispatch")
	if !strings.Contains(all, `{"shard":3,"s":7,"t":"GUILD_CREATE","session":"a1b2c3d4e5f6","d":{"id":"1"}}`+"\n") || strings.Count(all, "\n") != 3 {
		t.Fatalf("dispatch = %q", all)
	}
}

func TestMetricsParse(t *testing.T) {
	e := newEnv(t)
	e.tree.Dispatch(0, "a1b2c3d4e5f6", 2, "MESSAGE_CREATE", []byte(`{}`))
	text := readL(t, e.dotl(), "metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, text)
	}
	if mf := mfs["shardfs_shards"]; mf == nil || !strings.Contains(text, `shardfs_shards{state="READY"} 4`) {
		t.Fatalf("metrics lack the state counts:\n%s", text)
	}
	for _, name := range []string{"shardfs_shard_reconnects_total", "shardfs_dispatch_events_total", "go_goroutines", "process_resident_memory_bytes"} {
		if mfs[name] == nil {
			t.Errorf("metrics lack %s", name)
		}
	}
}

// The core's event-handling times reach /metrics as a histogram per kind.
func TestMetricsEventSeconds(t *testing.T) {
	e := newEnv(t)
	e.tree.ObserveEvent(core.EventFail, 3*time.Microsecond)
	e.tree.ObserveEvent(core.EventFail, 5*time.Millisecond)
	e.tree.ObserveEvent("novel-kind", time.Microsecond)
	if n := e.tree.DispatchCount(); n != 0 {
		t.Errorf("DispatchCount = %d before any dispatch", n)
	}
	e.tree.Dispatch(0, "a1b2c3d4e5f6", 2, "MESSAGE_CREATE", []byte(`{}`))
	if n := e.tree.DispatchCount(); n != 1 {
		t.Errorf("DispatchCount = %d; want 1", n)
	}
	text := readL(t, e.dotl(), "metrics")
	for _, want := range []string{
		`shardfs_core_event_seconds_count{kind="fail"} 2`,
		`shardfs_core_event_seconds_bucket{kind="fail",le="4e-06"} 1`,
		`shardfs_core_event_seconds_count{kind="novel-kind"} 1`,
		`shardfs_core_event_seconds_count{kind="resumed"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// Secrets never appear in the tree.
func TestNoSecretInTree(t *testing.T) {
	e := newEnv(t)
	e.tr.Last(0).Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("drop")})
	root := e.dotl()
	var all bytes.Buffer
	for _, p := range []string{"status", "plan", "lease", "metrics", "events", "0/diag", "0/events", "1/diag"} {
		all.WriteString(readL(t, root, p))
	}
	if strings.Contains(all.String(), secret) {
		t.Fatal("a session ID appears in the tree")
	}
}

func TestFormatShardList(t *testing.T) {
	for _, tc := range []struct {
		ids  []int
		want string
	}{{[]int{0, 1, 2, 3, 7}, "0-3,7"}, {[]int{5}, "5"}, {[]int{1, 3, 4}, "1,3-4"}, {nil, ""}} {
		if got := FormatShardList(tc.ids); got != tc.want {
			t.Errorf("FormatShardList(%v) = %q; want %q", tc.ids, got, tc.want)
		}
		if len(tc.ids) > 0 {
			if back, err := core.ParseShardList(tc.want); err != nil || len(back) != len(tc.ids) {
				t.Errorf("ParseShardList(%q) = %v, %v", tc.want, back, err)
			}
		}
	}
}

// /identify shows the pacer's budget, and /metrics its remaining count.
func TestIdentifyFile(t *testing.T) {
	var p *core.Pacer
	e := newEnv(t, func(c *Config) { c.Identify = func() core.Budget { return p.Budget() } })
	p = core.NewDiscordPacer(e.clk, 2)
	root := e.dotl()
	want := "total unknown\nremaining unknown\nreset_at none\nreset_in_ms none\nused_24h 0\nreserve 0\nmax_concurrency 2\nwaiting 0\nnext_slot_ms none\n"
	if got := readL(t, root, "identify"); got != want {
		t.Errorf("identify before discovery = %q; want %q", got, want)
	}
	p.SetStartLimit(core.StartLimit{Total: 5, Remaining: 3, ResetAfter: 2 * time.Hour, MaxConcurrency: 2})
	for shard := range 4 {
		p.Request(shard, false, func() {})
	}
	e.clk.Advance(time.Minute)
	want = "total 5\nremaining 1\nreset_at 2026-11-30T09:00:00Z\nreset_in_ms 7140000\nused_24h 2\nreserve 1\nmax_concurrency 2\nwaiting 2\nnext_slot_ms 7140000\n"
	if got := readL(t, root, "identify"); got != want {
		t.Errorf("identify = %q; want %q", got, want)
	}
	if m := readL(t, root, "metrics"); !strings.Contains(m, "\nshardfs_identify_remaining 1\n") {
		t.Errorf("metrics lack shardfs_identify_remaining 1:\n%s", m)
	}
}
