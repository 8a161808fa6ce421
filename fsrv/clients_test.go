package fsrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// Clients that no one here wrote, in-process: the hugelgupf/p9 client
// (9P2000.L, with the Google walkgetattr extension) and 9fans.net/go's
// client (9P2000, as plan9port's tools speak it).

func dialDotL(t testing.TB, addr string, opts ...p9.ClientOpt) (*p9.Client, p9.File) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := p9.NewClient(c, opts...)
	if err != nil {
		c.Close()
		t.Fatalf("p9.NewClient = %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	root, err := cl.Attach("")
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	return cl, root
}

func dial9(t testing.TB, addr string) *client.Fsys {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := client.NewConn(c)
	if err != nil {
		c.Close()
		t.Fatalf("client.NewConn = %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	return fsys
}

// readDotL walks to path, opens it read-only and reads it to the end.
func readDotL(t testing.TB, root p9.File, path string) string {
	t.Helper()
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		t.Fatalf("Walk(%s) = %v", path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		t.Fatalf("Open(%s) = %v", path, err)
	}
	var out []byte
	buf := make([]byte, 7) // small, so that a read takes several messages
	for {
		n, err := f.ReadAt(buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if n == 0 || errors.Is(err, io.EOF) {
			return string(out)
		}
		if err != nil {
			t.Fatalf("ReadAt(%s) = %v", path, err)
		}
	}
}

func writeDotL(root p9.File, path, data string) error {
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return err
	}
	n, err := f.WriteAt([]byte(data), 0)
	if err == nil && n != len(data) {
		return io.ErrShortWrite
	}
	return err
}

func TestDotLClient(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	_, root := dialDotL(t, addr)

	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Errorf("read status = %q; want %q", got, "READY\n")
	}
	if got := readDotL(t, root, "1/state"); got != "STARTING\n" {
		t.Errorf("read 1/state = %q; want %q", got, "STARTING\n")
	}
	if err := writeDotL(root, "ctl", "stop\nstart\n"); err != nil {
		t.Errorf("write ctl = %v; want nil", err)
	}
	if got, want := fx.takeHandled(), []string{"stop", "start"}; !slices.Equal(got, want) {
		t.Errorf("handled = %q; want %q", got, want)
	}
	fx.appendEvent("ts=1 event=ready\n")
	fx.appendEvent("ts=2 event=backoff\n")
	if got, want := readDotL(t, root, "events"), "ts=1 event=ready\nts=2 event=backoff\n"; got != want {
		t.Errorf("read events = %q; want %q", got, want)
	}
	if got := readDotL(t, root, "ctl"); got != "stop\nstart\nlease DURATION\n" {
		t.Errorf("read ctl = %q", got)
	}
}

// TestDotLWalkPaths checks both ways to reach a file's attributes: Twalk
// then Tgetattr (what Linux sends) and Twalkgetattr (what the hugelgupf
// client sends).
func TestDotLWalkPaths(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	_, root := dialDotL(t, addr)

	qids, f, err := root.Walk([]string{"1", "state"})
	if err != nil {
		t.Fatalf("Walk(1/state) = %v", err)
	}
	qid, valid, a, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		t.Fatalf("GetAttr = %v", err)
	}
	f.Close()
	qids2, f2, valid2, a2, err := root.WalkGetAttr([]string{"1", "state"})
	if err != nil {
		t.Fatalf("WalkGetAttr(1/state) = %v", err)
	}
	f2.Close()
	if len(qids) != 2 || len(qids2) != 2 || qids[1].Path != qid.Path || qids2[1].Path != qid.Path {
		t.Errorf("Walk QIDs = %v, WalkGetAttr QIDs = %v; want both to end in %v", qids, qids2, qid)
	}
	if valid != valid2 || a != a2 {
		t.Errorf("WalkGetAttr = %v %v; want what Walk+GetAttr gave: %v %v", valid2, a2, valid, a)
	}
	basic := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true, ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true}
	if !valid.Contains(basic) {
		t.Errorf("GetAttr valid = %v; want the basic fields %v", valid, basic)
	}
	if a.Size != uint64(len("STARTING\n")) || a.Mode != p9.ModeRegular|0444 {
		t.Errorf("GetAttr = %v; want size 9, mode -r--r--r--", a)
	}
	if _, _, _, _, err := root.WalkGetAttr([]string{"nosuch"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("WalkGetAttr(nosuch) = %v; want ENOENT", err)
	}
	if _, _, err := root.Walk([]string{"nosuch"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("Walk(nosuch) = %v; want ENOENT", err)
	}
}

func TestPlan9Client(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	fsys := dial9(t, addr)

	read := func(name string) string {
		t.Helper()
		fid, err := fsys.Open(name, plan9.OREAD)
		if err != nil {
			t.Fatalf("Open(%s) = %v", name, err)
		}
		defer fid.Close()
		b, err := io.ReadAll(fid)
		if err != nil {
			t.Fatalf("read %s = %v", name, err)
		}
		return string(b)
	}
	if got := read("status"); got != "READY\n" {
		t.Errorf("read status = %q; want %q", got, "READY\n")
	}
	fid, err := fsys.Open("ctl", plan9.OWRITE|plan9.OTRUNC)
	if err != nil {
		t.Fatalf("Open(ctl, OWRITE|OTRUNC) = %v", err)
	}
	// A bad line after good ones: the client is told the bytes applied,
	// resends from the bad line and gets its error.
	if n, err := fid.Write([]byte("stop\nlease 30s\nfrob\nstart\n")); n != 15 || err == nil || err.Error() != `invalid argument: unknown command "frob"` {
		t.Errorf("write ctl = %d, %v; want 15, invalid argument: unknown command \"frob\"", n, err)
	}
	fid.Close()
	if got, want := fx.takeHandled(), []string{"stop", "lease 30s"}; !slices.Equal(got, want) {
		t.Errorf("handled = %q; want %q", got, want)
	}
	fx.appendEvent("ts=1 event=ready\n")
	if got, want := read("events"), "ts=1 event=ready\n"; got != want {
		t.Errorf("read events = %q; want %q", got, want)
	}
	d, err := fsys.Stat("1/state")
	if err != nil {
		t.Fatalf("Stat(1/state) = %v", err)
	}
	if d.Name != "state" || d.Length != 9 || d.Mode != 0444 || d.Uid != "glenda" {
		t.Errorf("Stat(1/state) = %v; want name state, length 9, mode 0444, uid glenda", d)
	}
	if _, err := fsys.Open("status", plan9.OWRITE); err == nil || !strings.HasPrefix(err.Error(), "permission denied") {
		t.Errorf("Open(status, OWRITE) = %v; want permission denied", err)
	}
}

// TestDiodcatLogBelowStart: diod's diodcat (9P2000.L, as CI installs it)
// reads a log whose start was dropped from offset 0: it gets the retained
// lines once each, in order, and ends (issue 21 item 12).
func TestDiodcatLogBelowStart(t *testing.T) {
	diodcat, err := exec.LookPath("diodcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %v", err)
		}
		t.Skip(err)
	}
	fx := newFixture()
	for k := range 60 {
		fx.appendEvent(fmt.Sprintf("event %03d\n", k))
	}
	addr := listen(t, fx.server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, diodcat, "-s", addr, "-a", "/", "events").CombinedOutput()
	if err != nil {
		t.Fatalf("diodcat events: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) == 0 || len(lines) >= 60 || lines[len(lines)-1] != "event 059" {
		t.Fatalf("diodcat events = %d lines ending %q; want the retained lines, ending event 059", len(lines), lines[len(lines)-1])
	}
	first := 60 - len(lines)
	for i, l := range lines {
		if want := fmt.Sprintf("event %03d", first+i); l != want {
			t.Fatalf("diodcat events line %d = %q; want %q (each retained line once, in order)", i, l, want)
		}
	}
}
