package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// openPTY opens a pseudo-terminal pair through /dev/ptmx.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, tty
}

// screen replays what a terminal shows for out: \r returns to column 0,
// ESC[K erases to the end of the line, \n starts the next line.
func screen(out string) []string {
	var lines []string
	var line []rune
	col := 0
	for i := 0; i < len(out); {
		switch {
		case strings.HasPrefix(out[i:], "\033[K"):
			line = line[:col]
			i += 3
			continue
		case out[i] == '\r':
			col = 0
		case out[i] == '\n':
			lines = append(lines, string(line))
			line, col = line[:0:0], 0
		default:
			r := []rune(out[i : i+1])[0]
			if col < len(line) {
				line[col] = r
			} else {
				line = append(line, r)
			}
			col++
		}
		i++
	}
	return append(lines, string(line))
}

var logLine = regexp.MustCompile(`time=\S+ level=[A-Z]+ [^\n]*\n`)

// checkConsole checks a terminal's transcript: every log line begins at
// column 0 on a line of its own, and once the progress line is up, it is
// drawn again right after every log line (or replaced by the final one). It returns how many log lines
// came while the progress line was up.
func checkConsole(t *testing.T, out string) int {
	t.Helper()
	for _, l := range screen(out) {
		if strings.Contains(l, "level=") && (!strings.HasPrefix(l, "time=") || strings.Contains(l, "startup:")) {
			t.Errorf("a log line shares its line or does not start at column 0: %q", l)
		}
	}
	up := strings.Index(out, "startup: ")
	if up < 0 {
		t.Fatalf("no progress line in %q", out)
	}
	end := strings.Index(out, "startup done")
	if end < 0 {
		end = len(out)
	}
	under := 0
	for _, m := range logLine.FindAllStringIndex(out, -1) {
		if m[0] < up || m[1] > end {
			continue
		}
		under++
		if next := out[m[1]:]; !strings.HasPrefix(next, "startup: ") && !strings.HasPrefix(next, eraseLine+"startup done") {
			t.Errorf("after the log line %q the progress line is not drawn again; next: %q", out[m[0]:m[1]], out[m[1]:min(m[1]+40, len(out))])
		}
	}
	return under
}

// On a terminal, serve's log lines scroll above its startup progress
// line, which is drawn again below each of them.
func TestServeProgressOnTerminal(t *testing.T) {
	const token = "PTY-TOKEN-not-on-screen-42"
	// One identify at a time: shard 1 waits 5 s for its slot, so its log
	// lines come while the progress line is up.
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	master, tty := openPTY(t)
	defer master.Close()
	cmd := command(t, binDir(t), "serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto", "--listen", "tcp!127.0.0.1!0")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	cmd.Stderr = tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var out syncBuffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(&out, master) // ends with EIO once serve exits
	}()
	eventually(t, "startup done", func() (bool, string) {
		return strings.Contains(out.String(), "startup done"), out.String()
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v", err)
	}
	<-copied
	got := strings.ReplaceAll(out.String(), "\r\n", "\n") // the terminal's ONLCR
	if n := checkConsole(t, got); n == 0 {
		t.Errorf("no log line came while the progress line was up:\n%q", got)
	}
	if strings.Contains(got, token) {
		t.Errorf("the token reached the terminal")
	}
	t.Logf("terminal:\n%s", strings.Join(screen(got), "\n"))
}

// A failed discovery says "discovery" once, and the shards that shared
// the request do not repeat its text on stderr.
func TestDiscoveryFailureSaidOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := "http://" + l.Addr().String()
	l.Close() // refused from now on
	get := fmt.Sprintf("Get %q", api+"/gateway/bot")
	dir := binDir(t)

	// --total auto fails before any shard starts.
	cmd := command(t, dir, "serve", "--flavor", "discord", "--api", api, "--total", "auto", "--listen", "tcp!127.0.0.1!0")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN=DISCOVERY-TOKEN-9")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("serve --total auto against a refused API = %v; want an exit status\n%s", err, out)
	}
	if want := "shardfs: --total auto: gateway: discovery: " + get + ": dial tcp"; !strings.Contains(string(out), want) || strings.Count(string(out), "discovery") != 1 {
		t.Errorf("serve said %q; want one line with %q", out, want)
	}

	// Four shards in one bucket share one request and fail together.
	cmd = command(t, dir, "serve", "--flavor", "discord", "--api", api, "--total", "4", "--max-concurrency", "4", "--backoff", "fixed:1h", "--listen", "tcp!127.0.0.1!0")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN=DISCOVERY-TOKEN-9")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	eventually(t, "four shards in BACKOFF", func() (bool, string) {
		return strings.Count(stderr.String(), "msg=backoff") == 4, stderr.String()
	})
	s := stderr.String()
	if n := strings.Count(s, "Get \\\""); n != 1 {
		t.Errorf("the discovery error's text came %d times; want once:\n%s", n, s)
	}
	want := fmt.Sprintf(`err="discovery: Get \"%s/gateway/bot\": dial tcp`, api)
	if !strings.Contains(s, want) {
		t.Errorf("no backoff line with %s:\n%s", want, s)
	}
	if n := strings.Count(s, `err="same as shard `); n != 3 {
		t.Errorf("%d backoff lines point at the first; want 3:\n%s", n, s)
	}
}

// The console keeps the status line below the log lines, whatever the
// order in which the queue's writer sees them.
func TestConsoleKeepsStatusBelow(t *testing.T) {
	var b strings.Builder
	con := &console{w: &b, width: func() int { return 14 }}
	h, stop := newAsyncHandler(slog.NewTextHandler(con, nil), 16, con)
	log, status := slog.New(h), h.(*asyncHandler).q.status
	log.Info("before")
	status("startup: 0/2 READY", false) // wider than the terminal: clipped
	log.Info("first")
	status("startup: 1/2", false)
	log.Info("second")
	status("startup done", true)
	log.Info("after")
	stop()
	out := b.String()
	checkConsole(t, out)
	if strings.Contains(out, "startup: 0/2 R") || !strings.Contains(out, eraseLine+"startup: 0/2 "+eraseLine) {
		t.Errorf("a status line wider than the 14-column terminal was not clipped to 13 columns: %q", out)
	}
	var msgs []string
	for _, l := range screen(out) {
		if _, m, ok := strings.Cut(l, "msg="); ok {
			l = m
		}
		msgs = append(msgs, l)
	}
	if got, want := strings.Join(msgs, "|"), "before|first|second|startup done|after|"; got != want {
		t.Errorf("the terminal shows %q; want %q (raw %q)", got, want, out)
	}
}

// A burst of one long error on several shards is printed whole once.
func TestRepeatsShorten(t *testing.T) {
	const long = `discovery: Get "http://127.0.0.1:9/gateway/bot": dial tcp 127.0.0.1:9: connect: connection refused`
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var b repeats
	for _, tc := range []struct {
		at        time.Duration
		shard     int
		err, want string
	}{
		{0, 3, long, long},
		{time.Millisecond, 2, long, "same as shard 3"},
		{2 * time.Millisecond, 0, long, "same as shard 3"},
		{2 * time.Second, 1, long, long}, // a later attempt says it again
		{2*time.Second + time.Millisecond, 1, "operator reset", "operator reset"},
		{2*time.Second + 2*time.Millisecond, 0, "operator reset", "operator reset"},
	} {
		r := slog.NewRecord(t0.Add(tc.at), slog.LevelWarn, "backoff", 0)
		r.AddAttrs(slog.Int("shard", tc.shard), slog.String("err", tc.err), slog.Int("code", 0))
		var got string
		n := 0
		b.shorten(r).Attrs(func(a slog.Attr) bool {
			n++
			if a.Key == "err" {
				got = a.Value.String()
			}
			return true
		})
		if got != tc.want || n != 3 {
			t.Errorf("shard %d at %v: err=%q (%d attrs); want %q (3 attrs)", tc.shard, tc.at, got, n, tc.want)
		}
	}
}
