package baremetal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/internal/poll"
)

// lines is a console that hands each line to the test.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	l <- strings.TrimSuffix(string(p), "\n")
	return len(p), nil
}

func next(t *testing.T, l lines) string {
	t.Helper()
	select {
	case s := <-l:
		return s
	case <-time.After(10 * time.Second): // a bound on a hang, not a wait for a state
		t.Fatal("no console line within 10 s")
		return ""
	}
}

func TestRetryBackoff(t *testing.T) {
	clk := clock.NewFake()
	out := make(lines, 16)
	con := &console{w: out}
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- retry(context.Background(), clk, con, "DHCP", func() error {
			calls++
			switch calls {
			case 4:
				// A try that lasted RetryReset: the wait starts over.
				clk.Advance(RetryReset)
				return errors.New("lost after a while")
			case 6:
				return nil
			}
			return fmt.Errorf("no answer %d", calls)
		})
	}()
	for _, want := range []struct {
		line string
		wait time.Duration
	}{
		{"shardfs-init: DHCP failed: no answer 1; retrying in 1s", time.Second},
		{"shardfs-init: DHCP failed: no answer 2; retrying in 2s", 2 * time.Second},
		{"shardfs-init: DHCP failed: no answer 3; retrying in 4s", 4 * time.Second},
		{"shardfs-init: DHCP failed: lost after a while; retrying in 1s", time.Second},
		{"shardfs-init: DHCP failed: no answer 5; retrying in 2s", 2 * time.Second},
	} {
		if got := next(t, out); got != want.line {
			t.Fatalf("console = %q; want %q", got, want.line)
		}
		clk.Advance(want.wait - time.Nanosecond)
		select {
		case err := <-done:
			t.Fatalf("retry returned %v before its wait of %v ended", err, want.wait)
		default:
		}
		clk.Advance(time.Nanosecond)
	}
	if err := <-done; err != nil || calls != 6 {
		t.Errorf("retry = %v after %d calls; want nil after 6", err, calls)
	}
}

func TestRetryCapAndCancel(t *testing.T) {
	clk := clock.NewFake()
	out := make(lines, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- retry(ctx, clk, &console{w: out}, "the node", func() error { return errors.New("down") })
	}()
	var last string
	for range 8 {
		last = next(t, out)
		clk.Advance(RetryMax)
	}
	if !strings.HasSuffix(last, "retrying in 30s") {
		t.Errorf("8th failure: %q; want the wait capped at %v", last, RetryMax)
	}
	next(t, out) // waiting again
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("retry after cancel = %v; want context.Canceled", err)
	}
}

func TestReadToken(t *testing.T) {
	root := t.TempDir()
	out := make(lines, 4)
	con := &console{w: out}
	if tok := readToken(con, root); tok != "" {
		t.Errorf("readToken without secrets = %q; want empty", tok)
	}
	if l := next(t, out); !strings.Contains(l, `no token: no /secrets/token (no shardfs.enroll`) || !strings.Contains(l, `FATAL with "no token"`) {
		t.Errorf("console = %q; want it to say there is no token and what follows", l)
	}
	os.MkdirAll(filepath.Join(root, "secrets"), 0o700)
	if err := os.WriteFile(root+TokenPath, []byte("  tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok := readToken(con, root); tok != "tok-123" {
		t.Errorf("readToken = %q; want tok-123", tok)
	}
	if _, err := os.Stat(root + TokenPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the token file is still there after readToken: %v", err)
	}
	if len(out) != 0 {
		t.Errorf("console after a good token: %q", <-out)
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen []string
		files  []string
		ok     bool
		want   []string // listeners after
		line   string   // in the console
	}{
		{"no listener, no TLS", nil, nil, false, nil, "shardfs.listen: missing"},
		{"tls without files", []string{"tls!0.0.0.0!5641"}, nil, false, []string{"tls!0.0.0.0!5641"}, "no TLS files"},
		{"plain, no files", []string{"tcp!0.0.0.0!1,insecure"}, nil, true, []string{"tcp!0.0.0.0!1,insecure"}, ""},
		{"default with files", nil, []string{TLSCertPath, TLSKeyPath, TLSClientCAPath}, true, []string{DefaultListen}, "listening on " + DefaultListen},
		{"some files", nil, []string{TLSKeyPath}, false, nil, "only some of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(root+"/secrets", 0o700)
			for _, f := range tc.files {
				os.WriteFile(root+f, []byte("x"), 0o600)
			}
			out := make(lines, 4)
			s := Settings{Listen: tc.listen}
			if ok := checkListen(&console{w: out}, root, &s); ok != tc.ok {
				t.Errorf("checkListen = %v; want %v", ok, tc.ok)
			}
			if strings.Join(s.Listen, " ") != strings.Join(tc.want, " ") {
				t.Errorf("Listen = %q; want %q", s.Listen, tc.want)
			}
			var console string
			for len(out) > 0 {
				console += <-out + "\n"
			}
			if !strings.Contains(console, tc.line) || tc.line == "" && console != "" {
				t.Errorf("console = %q; want %q", console, tc.line)
			}
			if tc.ok && len(tc.files) == 3 && s.TLSKey != root+TLSKeyPath {
				t.Errorf("TLSKey = %q; want %q", s.TLSKey, root+TLSKeyPath)
			}
		})
	}
}

func TestReap(t *testing.T) {
	// A child nobody waits for stays a zombie until reap collects it.
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 3"}, &syscall.ProcAttr{})
	if err != nil {
		t.Skipf("no /bin/sh to fork: %v", err)
	}
	reaped := map[int]int{}
	// A process boundary: the child exits on its own time.
	_ = poll.Until(t.Context(), "the child reaped", 10*time.Second, 10*time.Millisecond, func() error {
		reap(func(p int, ws unix.WaitStatus) { reaped[p] = ws.ExitStatus() + 100 })
		if reaped[pid] == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	if reaped[pid] != 103 {
		t.Fatalf("reap saw %v; want pid %d with exit status 3", reaped, pid)
	}
	if _, err := unix.Wait4(pid, nil, unix.WNOHANG, nil); !errors.Is(err, unix.ECHILD) {
		t.Errorf("Wait4(%d) after reap = %v; want ECHILD (already reaped)", pid, err)
	}
}

func TestRootFSTable(t *testing.T) {
	got := RootFS.String()
	for _, want := range []string{
		"mount proc     /proc      proc     nosuid,nodev,noexec\n",
		"mount devtmpfs /dev       devtmpfs nosuid,mode=0755\n",
		"mount devpts   /dev/pts   devpts   nosuid,noexec,mode=0620,ptmxmode=0666\n",
		"mount tmpfs    /tmp       tmpfs    nosuid,nodev,mode=1777\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("RootFS.String() =\n%s\nwant a line %q", got, want)
		}
	}
	// /dev/pts needs /dev first.
	dev, pts := strings.Index(got, " /dev "), strings.Index(got, " /dev/pts ")
	if dev < 0 || pts < dev {
		t.Errorf("RootFS mounts /dev/pts before /dev:\n%s", got)
	}
}

func TestClockFloor(t *testing.T) {
	if f := clockFloor(); f.Year() < 2026 {
		t.Errorf("clockFloor() = %v; want the build's time, not before 2026", f)
	}
}

// TestRunNodeRefuses: a fatal key on the command line stops the node:
// it never runs, and the refusal is repeated once a minute until the
// context ends.
func TestRunNodeRefuses(t *testing.T) {
	clk := clock.NewFake()
	out := make(lines, 16)
	ctx, cancel := context.WithCancel(context.Background())
	s, probs := ParseCmdline("shardfs.flavor=discord shardfs.total=2 shardfs.listen=tcp!0.0.0.0!5641")
	if len(probs) != 1 || !probs[0].Fatal {
		t.Fatalf("problems = %v; want one fatal", probs)
	}
	ran := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- runNode(ctx, clk, &console{w: out}, func(context.Context, Settings, string) error {
			ran <- struct{}{}
			return nil
		}, t.TempDir(), s, true, "", nil)
	}()
	const want = "shardfs-init: refusing to start the node: fix the shardfs.* keys above on the kernel command line and reboot"
	for l := next(t, out); l != want; l = next(t, out) { // the token's and the listener's lines come first
	}
	clk.Advance(time.Minute - time.Nanosecond)
	select {
	case l := <-out:
		t.Fatalf("console before a minute passed: %q", l)
	default:
	}
	clk.Advance(time.Nanosecond)
	if l := next(t, out); l != want {
		t.Fatalf("console after a minute = %q; want the refusal again", l)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("runNode = %v; want context.Canceled", err)
	}
	select {
	case <-ran:
		t.Error("the node ran despite the refusal")
	default:
	}
}

// TestRunNodeWithoutSecrets: the TLS files are there but no token (an
// enrollment server without --token-file): the node runs on the default
// TLS listener with no token, and the console says so.
func TestRunNodeWithoutSecrets(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(root+"/secrets", 0o700)
	for _, f := range []string{TLSCertPath, TLSKeyPath, TLSClientCAPath} {
		os.WriteFile(root+f, []byte("x"), 0o600)
	}
	s, probs := ParseCmdline("shardfs.flavor=discord shardfs.total=2 shardfs.etcd=http://10.0.2.2:2379 shardfs.bot=b")
	if len(probs) != 0 {
		t.Fatal(probs)
	}
	out := make(lines, 16)
	ctx, cancel := context.WithCancel(context.Background())
	type call struct {
		s     Settings
		token string
	}
	calls := make(chan call, 1)
	done := make(chan error, 1)
	go func() {
		done <- runNode(ctx, clock.NewFake(), &console{w: out}, func(ctx context.Context, s Settings, token string) error {
			calls <- call{s, token}
			<-ctx.Done()
			return nil
		}, root, s, false, "", net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56})
	}()
	var c call
	select {
	case c = <-calls:
	case <-time.After(10 * time.Second): // a bound on a hang
		t.Fatal("the node did not run")
	}
	cancel()
	<-done
	if c.token != "" || c.s.TLSKey != root+TLSKeyPath || strings.Join(c.s.Listen, " ") != DefaultListen || c.s.Node != "pxe-52-54-00-12-34-56" {
		t.Errorf("Run(%+v, %q); want no token, the TLS files, %s, the node named after the NIC", c.s, c.token, DefaultListen)
	}
	var console []string
	for len(out) > 0 {
		console = append(console, <-out)
	}
	text := strings.Join(console, "\n")
	for _, want := range []string{`every shard is FATAL with "no token"`, "listening on " + DefaultListen + " (the default: enrollment brought the TLS files)", `this node is "pxe-52-54-00-12-34-56"`, "without a token: its tree only, every shard FATAL, no etcd"} {
		if !strings.Contains(text, want) {
			t.Errorf("console =\n%s\nwant %q", text, want)
		}
	}
	if strings.Contains(text, "shardfs serve --etcd") {
		t.Errorf("console =\n%s\nsays the tokenless node starts serve --etcd", text)
	}
}
