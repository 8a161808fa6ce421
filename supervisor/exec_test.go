package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/internal/poll"
)

const testToken = "TEST-TOKEN-on-a-pipe-only"

// testChild is the test binary run as a child by Exec: it checks how it
// got its token, then behaves as mode says.
func testChild(mode string) int {
	tok, err := readFD(3)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "token:", err)
		return 3
	case tok != testToken:
		fmt.Fprintln(os.Stderr, "token: wrong")
		return 3
	case strings.Contains(strings.Join(os.Environ(), "\n")+strings.Join(os.Args, " "), testToken):
		fmt.Fprintln(os.Stderr, "token: in the environment or arguments")
		return 3
	}
	l, err := LinkFromEnv()
	if err != nil || l == nil {
		fmt.Fprintln(os.Stderr, "link:", err)
		return 4
	}
	defer l.Close()
	fmt.Fprintln(os.Stderr, "token ok")
	switch mode {
	case "garbage":
		l.w.raw([]byte("this is not a message\n"))
	case "close":
		l.f.Close()
		time.Sleep(time.Hour) // until the parent's SIGTERM
	case "stubborn":
		// Neither SIGTERM nor the channel's shutdown ends it.
		signal.Ignore(syscall.SIGTERM)
		l.Ready("")
		fmt.Fprintln(os.Stderr, "stubborn ready")
		time.Sleep(time.Hour)
	case "lines":
		// Its last lines are in the channel when it exits, as a
		// clean stop's flush is; well under a socket's buffer, so
		// that it exits with nobody reading.
		// One write, as Copy's: small writes each take a socket
		// buffer's overhead.
		var b []byte
		for i := range linesSent {
			b = fmt.Appendf(b, "{\"shard\":0,\"n\":%d}\n", i)
		}
		l.data.raw(b)
		return 0
	case "limit":
		// Its discovery found the day's budget spent: the parent's
		// pacer, which knew nothing, must learn it before the
		// identify request and hold it.
		own := core.NewDiscordPacer(nil, 1)
		own.SetStartLimit(core.StartLimit{Total: 1000, Remaining: 0, ResetAfter: time.Hour, MaxConcurrency: 1})
		l.LimitsFrom(own)
		l.Ready("")
		l.Pacer().Request(0, false, func() { fmt.Fprintln(os.Stderr, "identify granted") })
		fmt.Fprintln(os.Stderr, "identify asked")
		<-l.Done()
		return 0
	case "forge":
		// A buggy child speaks for shards outside its block (it owns
		// shard 0 of 2), with a limit that cannot be, then pushes its
		// own shard's state: the parent refuses the first four and
		// takes the last.
		signal.Ignore(syscall.SIGTERM)
		l.Ready("")
		l.w.send(msg{T: "identify", ID: 1, Shard: 1})
		l.w.send(msg{T: "written", Shard: 1, At: time.Now().UnixNano()})
		l.w.send(msg{T: "limit", Total: 10, Remaining: 20, MaxConc: 1})
		l.w.send(msg{T: "limit", Total: 1000, Remaining: 0, ResetAfterMs: 1e15, MaxConc: 1})
		l.w.send(msg{T: "shard", Shard: 1, State: "READY"})
		l.w.send(ShardState{State: "READY", Seq: -5}.msg(0))
		l.w.send(ShardState{State: "READY", Seq: 7, Reconnects: 1<<64 - 1}.msg(0))
		l.w.send(ShardState{State: "READY", Seq: 7, LatencyMs: -1}.msg(0))
		l.w.send(ShardState{State: "READY", Seq: 7}.msg(0))
		fmt.Fprintln(os.Stderr, "forged")
		<-l.Done()
		return 0
	case "readyspoof":
		// Its first ready names a socket the parent did not assign
		// (another process's), then the one it was told to listen on.
		l.Ready(filepath.Join(os.TempDir(), "another-supervise", "0.sock"))
		l.Ready(listenSockets(os.Args)[0])
		<-l.Done()
		return 0
	case "repeat":
		// A child asks 50 times for an identify of its own shard 0,
		// then pushes its state (which the parent reads after them).
		l.Ready("")
		for id := range uint64(50) {
			l.w.send(msg{T: "identify", ID: id + 1, Shard: 0})
		}
		l.w.send(ShardState{State: "STARTING", NoSeq: true}.msg(0))
		<-l.Done()
		return 0
	case "fork":
		// A grandchild that inherits stdout and stderr and outlives
		// the child by far: the parent must reap the child at once.
		cmd := exec.Command("sleep", "3600")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "fork:", err)
			return 6
		}
		fmt.Fprintf(os.Stderr, "grandchild %d\n", cmd.Process.Pid)
		return 0
	case "quiet":
		for i := range quietLines {
			fmt.Fprintf(os.Stderr, "quiet %d\n", i)
		}
		return 0
	case "flood":
		line := strings.Repeat("x", 100) + "\n"
		for range 20000 {
			os.Stderr.WriteString(line)
		}
		fmt.Fprintln(os.Stderr, "flood done")
		return 0
	}
	// It leaves on the channel's shutdown alone, which comes with the
	// SIGTERM.
	signal.Ignore(syscall.SIGTERM)
	l.Ready("")
	l.w.send(msg{T: "status", Ready: 1, Total: 1})
	granted := make(chan struct{})
	if now, _ := l.Pacer().Request(0, false, func() { close(granted) }); now {
		return 5
	}
	<-granted
	fmt.Fprintln(os.Stderr, "identify granted")
	<-l.Done()
	fmt.Fprintln(os.Stderr, "shutdown:", l.Err())
	return 0
}

func readFD(fd uintptr) (string, error) {
	f := os.NewFile(fd, "token")
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

// blockedWriter blocks every write until released, like a stderr that
// nobody reads.
type blockedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	b       bytes.Buffer
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *blockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestExecChildren runs real children: one well-behaved (token on its
// pipe, ready, an identify granted by the shared pacer, shutdown on the
// channel), one writing garbage on its channel, one closing it, one
// flooding stderr while the parent's stderr is blocked, one ignoring
// SIGTERM and the shutdown (killed after the shutdown timeout, logged
// first). The parent names
// each bad child and keeps the good one running; the flood neither blocks
// the child nor the parent, and the drop is said.
func TestExecChildren(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseAssign(5, "good=0;garbage=1;close=2;flood=3;stubborn=4")
	if err != nil {
		t.Fatal(err)
	}
	// The flooding child writes to a stderr nobody reads; the others to
	// one that is read.
	out := &blockedWriter{release: make(chan struct{})}
	blocked := NewOutput(out)
	free := &blockedWriter{release: make(chan struct{})}
	close(free.release)
	output := NewOutput(free)
	j := &record{t: t}
	newExec := func(o *Output) *Exec {
		return &Exec{
			Path: self, Args: func(l Launch) []string { return []string{"-test.run=none"} },
			Token: testToken, Pacer: core.NewDiscordPacer(nil, 1), Output: o,
		}
	}
	ex, exFlood := newExec(output), newExec(blocked)
	pol := Policy{MaxAttempts: 100, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	launch := func(l Launch, r *Reports) (Process, error) {
		e := ex
		if l.ID == "flood" {
			e = exFlood
		}
		e.Env = append(os.Environ(), "SUPERVISOR_TEST_CHILD="+l.ID)
		return e.Launch(l, r)
	}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	waitFor(t, "the bad children named", func() bool {
		return j.index(0, "private channel failed", "child=garbage", "this is not a message") >= 0 &&
			j.index(0, "private channel failed", "child=close", "closed its private channel") >= 0 &&
			j.index(0, "child exited unexpectedly", "child=flood", "exit status 0") >= 0
	})
	if c := s.Children()[0]; c.State != Running || c.Generation != 1 {
		t.Fatalf("good = %v; want running, untouched", c)
	}
	waitFor(t, "the good child's identify", func() bool { return strings.Contains(free.String(), "[child good] identify granted") })
	waitFor(t, "the stubborn child ready", func() bool { return strings.Contains(free.String(), "[child stubborn] stubborn ready") })
	close(out.release)
	s.Close()
	logged := j.index(0, "forced termination", "child=stubborn")
	killed := j.index(0, "child stopped", "child=stubborn", "signal: killed")
	if logged < 0 || killed < logged {
		t.Errorf("the stubborn child: forced termination logged at %d, its SIGKILLed exit at %d", logged, killed)
	}
	if j.index(0, "forced termination", "child=good") >= 0 {
		t.Error("the good child was killed")
	}
	ex.Wait()
	exFlood.Wait()
	output.Close()
	blocked.Close()
	text := free.String() + out.String()
	for _, want := range []string{"[child good] token ok", "[child good] shutdown: the parent asked for a shutdown", "[child flood] (", "lines dropped"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(text, "token:") {
		t.Errorf("a child did not get its token as it should:\n%s", text)
	}
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !strings.HasPrefix(l, "[child ") {
			t.Fatalf("unlabelled line %q", l)
		}
	}
}

// waitFor polls cond, at a process boundary, for at most 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := poll.Until(t.Context(), what, 30*time.Second, 20*time.Millisecond, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testExec returns an Exec running this test binary as the children of
// assign (of total shards), each in the mode named by its ID, and the
// assignment; launch is Exec.Launch with the child's mode set.
func testExec(t *testing.T, total int, assign string, output *Output, pacer core.IdentifyPacer) (ex *Exec, a Assignment, launch Launcher) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if a, err = ParseAssign(total, assign); err != nil {
		t.Fatal(err)
	}
	ex = &Exec{
		Path: self, Args: func(Launch) []string { return []string{"-test.run=none"} },
		Token: testToken, Pacer: pacer, Output: output,
	}
	launch = func(l Launch, r *Reports) (Process, error) {
		ex.Env = append(os.Environ(), "SUPERVISOR_TEST_CHILD="+l.ID)
		return ex.Launch(l, r)
	}
	return ex, a, launch
}

// linesSent is what the "lines" child writes on its channel before it
// exits: about 20 KB.
const linesSent = 1000

// TestExecReadsChannelToItsEnd: a child writes its last dispatch lines
// and exits while the parent is slow to take them (Lines holds the first
// one until the child is reaped). Every line must still reach Lines, and
// before the exit is reported: a clean stop saves the sessions at the
// child's last sequence, so a line dropped here is lost for good (restart
// all lost 828 of 20,000 lines at a slow reader when the channel was
// closed at the exit).
func TestExecReadsChannelToItsEnd(t *testing.T) {
	output := NewOutput(io.Discard)
	pids := make(chan int, 1)
	var (
		mu       sync.Mutex
		got      []string
		atExit   = -1
		reaped   bool
		reapedCh = make(chan struct{})
	)
	ex, a, launchExec := testExec(t, 1, "lines=0", output, core.NewDiscordPacer(nil, 1))
	ex.Lines = func(child, kind string, line []byte) {
		mu.Lock()
		first := !reaped
		reaped = true
		mu.Unlock()
		if first {
			// The child is gone before the parent reads on.
			pid := <-pids
			waitFor(t, "the child reaped", func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
			close(reapedCh)
		}
		mu.Lock()
		got = append(got, string(line))
		mu.Unlock()
	}
	j := &record{t: t}
	launch := func(l Launch, r *Reports) (Process, error) {
		p, err := launchExec(l, r)
		if err == nil {
			pids <- p.Pid()
		}
		return p, err
	}
	pol := Policy{MaxAttempts: 0, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	<-s.Done() // the child exits: --restart-max 0 fails the supervisor
	mu.Lock()
	atExit = len(got)
	mu.Unlock()
	ex.Wait()
	output.Close()
	<-reapedCh
	if atExit != linesSent {
		t.Errorf("%d of %d lines had reached Lines when the exit was reported", atExit, linesSent)
	}
	for i, l := range got {
		if want := fmt.Sprintf("{\"shard\":0,\"n\":%d}\n", i); l != want {
			t.Fatalf("line %d = %q; want %q", i, l, want)
		}
	}
	if j.index(0, "private channel failed") >= 0 {
		t.Errorf("the exit was taken for a broken channel:\n%s", strings.Join(j.all(), "\n"))
	}
}

// TestExecLimitReachesParent: a child's discovery says the budget is
// spent; the parent's pacer, whose own discovery failed (it knows no
// budget), learns it from the channel before the child's identify
// request, and holds the request instead of granting it.
func TestExecLimitReachesParent(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	close(out.release)
	output := NewOutput(out)
	pacer := core.NewDiscordPacer(nil, 1)
	ex, a, launch := testExec(t, 1, "limit=0", output, pacer)
	ex.Limits = func(_ string, l core.StartLimit) { pacer.SetStartLimit(l) }
	pol := Policy{MaxAttempts: 0, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch})
	s.Start()
	waitFor(t, "the identify asked", func() bool { return strings.Contains(out.String(), "identify asked") })
	waitFor(t, "the request waiting at the parent", func() bool { n, _ := pacer.Waiting(); return n == 1 })
	b := pacer.Budget()
	s.Close()
	ex.Wait()
	output.Close()
	if b.Total != 1000 || b.Remaining != 0 || b.ResetAt.IsZero() {
		t.Errorf("the parent's budget = %+v; want the child's: total 1000, none remaining, a reset time", b)
	}
	if strings.Contains(out.String(), "identify granted") {
		t.Error("the parent granted an identify the budget does not allow")
	}
}

// TestExecForgedMessages: identify, written, limit and shard messages for
// shards outside the child's block, or with figures that cannot be, are
// refused and logged; the child is not stopped, the pacer asked nothing,
// and its own shard's state is taken.
func TestExecForgedMessages(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	close(out.release)
	output := NewOutput(out)
	pacer := core.NewDiscordPacer(nil, 1)
	ex, a, launch := testExec(t, 2, "forge=0", output, pacer)
	j := &record{t: t}
	ex.Logger = slog.New(journalHandler{j: j})
	var limits int
	var mu sync.Mutex
	var states []string
	ex.Limits = func(string, core.StartLimit) { mu.Lock(); limits++; mu.Unlock() }
	ex.States = func(child string, gen, shard int, st ShardState) {
		mu.Lock()
		states = append(states, fmt.Sprintf("%s %d %d %s %d", child, gen, shard, st.State, st.Seq))
		mu.Unlock()
	}
	pol := Policy{MaxAttempts: 0, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	waitFor(t, "its own shard's state taken", func() bool { mu.Lock(); defer mu.Unlock(); return len(states) > 0 })
	for _, typ := range []string{"identify", "written", "limit", "shard"} {
		if j.index(0, "refused a message on a child's private channel", "type="+typ) < 0 {
			t.Errorf("the forged %s message was not refused and logged", typ)
		}
	}
	for _, why := range []string{"a negative sequence -5", "18446744073709551615 reconnects", "a latency of -1 ms"} {
		if j.index(0, "refused a message on a child's private channel", "type=shard", why) < 0 {
			t.Errorf("its own shard's state with %s was not refused and logged", why)
		}
	}
	if n, _ := pacer.Waiting(); n != 0 || pacer.Budget().Total != 0 {
		t.Errorf("the pacer: %d waiting, budget %+v; want nothing asked or learnt", n, pacer.Budget())
	}
	if c := s.Children()[0]; c.State != Running || c.Generation != 1 {
		t.Errorf("forge = %+v; want running, untouched", c)
	}
	s.Close()
	ex.Wait()
	output.Close()
	mu.Lock()
	defer mu.Unlock()
	if limits != 0 || len(states) != 1 || states[0] != "forge 1 0 READY 7" {
		t.Errorf("limits %d, states %q; want none and [forge 1 0 READY 7]", limits, states)
	}
}

// TestExecReadyOnlyAssignedSocket: a ready that names a socket other than
// the one the parent told the child to listen on is refused and logged
// (the parent would forward the child's reads and operator commands
// there); the child's ready with its own socket is taken.
func TestExecReadyOnlyAssignedSocket(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	close(out.release)
	output := NewOutput(out)
	ex, a, launch := testExec(t, 1, "readyspoof=0", output, core.NewDiscordPacer(nil, 1))
	own := filepath.Join(t.TempDir(), "0.sock")
	ex.Args = func(Launch) []string { return []string{"-test.run=none", "--listen", "unix!" + own} }
	j := &record{t: t}
	ex.Logger = slog.New(journalHandler{j: j})
	pol := Policy{MaxAttempts: 0, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: time.Minute, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	waitFor(t, "the child running", func() bool { return s.Children()[0].State == Running })
	if c := s.Children()[0]; c.Socket != own {
		t.Errorf("child socket = %q; want %q, the one the parent assigned", c.Socket, own)
	}
	if j.index(0, "refused a message on a child's private channel", "type=ready", "another-supervise") < 0 {
		t.Error("the ready naming another socket was not refused and logged")
	}
	s.Close()
	ex.Wait()
	output.Close()
}

// TestExecOneRequestPerShard: a child that asks again and again for its
// own shard's identify has one request outstanding at most (each new one
// cancels the one before, logged), so it cannot drain the shared budget.
func TestExecOneRequestPerShard(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	close(out.release)
	output := NewOutput(out)
	pacer := core.NewDiscordPacer(nil, 1)
	ex, a, launch := testExec(t, 1, "repeat=0", output, pacer)
	j := &record{t: t}
	ex.Logger = slog.New(journalHandler{j: j})
	pushed := make(chan struct{})
	var once sync.Once
	ex.States = func(string, int, int, ShardState) { once.Do(func() { close(pushed) }) }
	pol := Policy{MaxAttempts: 0, MinDelay: time.Millisecond, MaxDelay: time.Millisecond, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	<-pushed // after the 50 requests on the same stream
	if n, _ := pacer.Waiting(); n > 1 {
		t.Errorf("the pacer has %d requests waiting for the child's one shard; want at most 1", n)
	}
	if j.index(0, "refused a message on a child's private channel", "type=identify", "a second identify request") < 0 {
		t.Error("the repeated requests were not logged")
	}
	s.Close()
	ex.Wait()
	output.Close()
}

// TestExecReapsPastGrandchild: a child that starts a long-lived
// grandchild (which holds its stdout and stderr) and exits is reaped at
// once: its exit is reported, restarted, /children says how it ended.
func TestExecReapsPastGrandchild(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	close(out.release)
	output := NewOutput(out)
	ex, a, launch := testExec(t, 1, "fork=0", output, core.NewDiscordPacer(nil, 1))
	j := &record{t: t}
	pol := Policy{MaxAttempts: 1, MinDelay: time.Hour, MaxDelay: time.Hour, HealthyReset: time.Hour, StartupTimeout: 20 * time.Second, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	defer func() {
		for _, l := range strings.Split(out.String(), "\n") {
			var pid int
			if _, err := fmt.Sscanf(l, "[child fork] grandchild %d", &pid); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		s.Close()
		ex.Wait()
		output.Close()
	}()
	// Bounded by the startup timeout (20 s): a child not reaped stays
	// starting until then.
	waitFor(t, "the child reaped and waiting to restart", func() bool {
		c := s.Children()[0]
		return c.State == Restarting && c.LastExitWord == "exit:0"
	})
	if i := j.index(0, "child startup timeout"); i >= 0 {
		t.Errorf("the child was reaped only at its startup timeout")
	}
	if !strings.Contains(s.Children()[0].String(), " exit:0") {
		t.Errorf("/children line %q does not say how it ended", s.Children()[0])
	}
}

// quietLines is what the "quiet" child writes on its stderr.
const quietLines = 100

// TestOutputFloodSharesFairly: a flooding child and a quiet one share the
// parent's stderr, which nobody reads until both exited. The flood fills
// its own queue and loses lines (said); every line of the quiet child
// arrives (one queue for all lost most of them).
func TestOutputFloodSharesFairly(t *testing.T) {
	out := &blockedWriter{release: make(chan struct{})}
	output := NewOutput(out)
	ex, a, launch := testExec(t, 2, "flood=0;quiet=1", output, core.NewDiscordPacer(nil, 1))
	j := &record{t: t}
	// No restart within the test: the delay is an hour.
	pol := Policy{MaxAttempts: 100, MinDelay: time.Hour, MaxDelay: time.Hour, HealthyReset: time.Hour, StartupTimeout: time.Hour, ShutdownTimeout: 3 * time.Second}
	s := New(Config{Assignment: a, Policy: pol, Launch: launch, Logger: slog.New(journalHandler{j: j})})
	s.Start()
	waitFor(t, "both children exited", func() bool {
		return j.index(0, "child exited unexpectedly", "child=flood") >= 0 && j.index(0, "child exited unexpectedly", "child=quiet") >= 0
	})
	close(out.release)
	s.Close()
	ex.Wait()
	output.Close()
	text := out.String()
	for i := range quietLines {
		if !strings.Contains(text, fmt.Sprintf("[child quiet] quiet %d\n", i)) {
			t.Fatalf("the quiet child's line %d was lost to the flood", i)
		}
	}
	if !strings.Contains(text, "[child flood] (") || !strings.Contains(text, "lines dropped") {
		t.Error("the flood's drop is not said")
	}
	if strings.Contains(text, "[child quiet] (") {
		t.Error("the quiet child lost lines")
	}
}
