package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/clock"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("SUPERVISOR_TEST_CHILD"); mode != "" {
		os.Exit(testChild(mode))
	}
	goleak.VerifyTestMain(m)
}

// record records, in order, what the supervisor logged and what it did
// to the fake processes, so that a test can check that it logs before it
// acts.
type record struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (j *record) add(line string) {
	j.mu.Lock()
	j.lines = append(j.lines, line)
	j.mu.Unlock()
	j.t.Log(line)
}

func (j *record) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// index returns the position of the first line at or after from that
// contains every substring, or -1.
func (j *record) index(from int, subs ...string) int {
	for i, l := range j.all() {
		if i < from {
			continue
		}
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return i
		}
	}
	return -1
}

type journalHandler struct {
	j     *record
	attrs []slog.Attr
}

func (h journalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h journalHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "log %s %q", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.j.add(b.String())
	return nil
}
func (h journalHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return journalHandler{h.j, append(h.attrs, a...)}
}
func (h journalHandler) WithGroup(string) slog.Handler { return h }

type fakeProc struct {
	j       *record
	id      string
	pid     int
	launch  Launch
	reports *Reports
	mu      sync.Mutex
	signals []os.Signal
}

func (p *fakeProc) Pid() int { return p.pid }
func (p *fakeProc) Signal(sig os.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	p.mu.Unlock()
	p.j.add(fmt.Sprintf("signal %s gen %d %v", p.id, p.launch.Generation, sig))
	return nil
}

func (p *fakeProc) got() []os.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.signals)
}

type harness struct {
	t   *testing.T
	j   *record
	clk *clock.Fake
	s   *Supervisor

	mu       sync.Mutex
	launches []*fakeProc
	fail     map[string]error // launch errors by child id
	nextPid  int
}

// newHarness runs the assignment's fake children without the watchdog,
// which would kill them as the tests advance the clock (they report
// nothing); newWatchdogHarness keeps it.
func newHarness(t *testing.T, a Assignment, pol Policy) *harness {
	pol.Watchdog = 0
	return newWatchdogHarness(t, a, pol)
}

func newWatchdogHarness(t *testing.T, a Assignment, pol Policy) *harness {
	h := &harness{t: t, j: &record{t: t}, clk: clock.NewFake(), fail: map[string]error{}, nextPid: 100}
	h.s = New(Config{
		Assignment: a, Policy: pol, Clock: h.clk, Logger: slog.New(journalHandler{j: h.j}),
		Launch: func(l Launch, r *Reports) (Process, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if err := h.fail[l.ID]; err != nil {
				return nil, err
			}
			h.nextPid++
			p := &fakeProc{j: h.j, id: l.ID, pid: h.nextPid, launch: l, reports: r}
			h.launches = append(h.launches, p)
			h.j.add(fmt.Sprintf("launch %s gen %d attempt %d", l.ID, l.Generation, l.Attempt))
			return p, nil
		},
	})
	return h
}

// last returns the newest process of child id.
func (h *harness) last(id string) *fakeProc {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.launches) - 1; i >= 0; i-- {
		if h.launches[i].id == id {
			return h.launches[i]
		}
	}
	h.t.Fatalf("child %s never launched", id)
	return nil
}

func (h *harness) launchesOf(id string) []Launch {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Launch
	for _, p := range h.launches {
		if p.id == id {
			out = append(out, p.launch)
		}
	}
	return out
}

func (h *harness) state(id string) ChildInfo {
	for _, c := range h.s.Children() {
		if c.ID == id {
			return c
		}
	}
	h.t.Fatalf("no child %s", id)
	return ChildInfo{}
}

func (h *harness) wantState(id string, want State) {
	h.t.Helper()
	if got := h.state(id).State; got != want {
		h.t.Fatalf("child %s state = %s; want %s", id, got, want)
	}
}

func (h *harness) done() bool {
	select {
	case <-h.s.Done():
		return true
	default:
		return false
	}
}

var exit1 = errors.New("exit status 1")

func twoChildren(t *testing.T) Assignment {
	a, err := ParseAssign(8, "a=0-3;b=4-7")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestDelay(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 7; n++ {
		got = append(got, DefaultPolicy.Delay(n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("Delay(1..7) = %v; want %v", got, want)
	}
}

// TestCrashLoop: with --fail-all, a child that exits at once is restarted
// at attempts 1, 2 and 3 after 1 s, 2 s and 4 s, then fails; the other
// child is stopped and the supervisor's error names the child and its
// last exit.
func TestCrashLoop(t *testing.T) {
	pol := DefaultPolicy
	pol.FailAll = true
	h := newHarness(t, twoChildren(t), pol)
	h.s.Start()
	h.last("b").reports.Ready("")
	h.last("a").reports.Exited(exit1)
	for attempt, delay := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		h.wantState("a", Restarting)
		if next, ok := h.clk.Next(); !ok || next != delay {
			t.Fatalf("attempt %d: next timer in %v (%v); want %v", attempt+1, next, ok, delay)
		}
		if i := h.j.index(0, "restarting child", fmt.Sprintf("attempt=%d", attempt+1), "delay="+delay.String()); i < 0 {
			t.Fatalf("attempt %d with delay %v was not logged", attempt+1, delay)
		}
		h.clk.Advance(delay - time.Millisecond)
		h.wantState("a", Restarting)
		h.clk.Advance(time.Millisecond)
		h.wantState("a", Starting)
		if l := h.last("a").launch; l.Attempt != attempt+1 || l.Generation != attempt+2 {
			t.Fatalf("launch = %+v; want attempt %d generation %d", l, attempt+1, attempt+2)
		}
		h.last("a").reports.Exited(exit1)
	}
	h.wantState("a", Failed)
	h.wantState("b", Stopping)
	if h.done() {
		t.Fatal("done before b exited")
	}
	logged := h.j.index(0, "restart budget exhausted", "child=a")
	signalled := h.j.index(0, "signal b gen 1 terminated")
	if logged < 0 || signalled < 0 || logged > signalled {
		t.Fatalf("budget exhausted logged at %d, b signalled at %d; want the log first", logged, signalled)
	}
	h.last("b").reports.Exited(nil)
	if !h.done() {
		t.Fatal("not done after every child exited")
	}
	h.wantState("b", Closed)
	err := h.s.Err()
	if err == nil || !strings.Contains(err.Error(), `"a"`) || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("Err() = %v; want it to name child a and exit status 1", err)
	}
	if got := h.state("a").Restarts; got != 3 {
		t.Errorf("a restarts = %d; want 3", got)
	}
}

// TestRestartMaxZero: with no restarts allowed, the first unexpected exit
// fails the supervisor.
func TestRestartMaxZero(t *testing.T) {
	pol := DefaultPolicy
	pol.MaxAttempts = 0
	pol.FailAll = true
	h := newHarness(t, twoChildren(t), pol)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.last("b").reports.Exited(errors.New("signal: killed"))
	h.wantState("b", Failed)
	h.wantState("a", Stopping)
	h.last("a").reports.Exited(nil)
	if !h.done() {
		t.Fatal("not done")
	}
	if err := h.s.Err(); err == nil || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), "signal: killed") || !strings.Contains(err.Error(), "--restart-max is 0") {
		t.Fatalf("Err() = %v", err)
	}
	if n := len(h.launchesOf("b")); n != 1 {
		t.Errorf("b launched %d times; want 1", n)
	}
}

// TestHealthyReset: a child that ran for the healthy-reset time with every
// shard READY gets its budget back, so a crash much later starts again at
// attempt 1.
func TestHealthyReset(t *testing.T) {
	a, _ := ByProcesses(4, 1)
	h := newHarness(t, a, DefaultPolicy)
	h.s.Start()
	h.last("c0").reports.Exited(exit1)
	h.clk.Advance(time.Second)
	h.last("c0").reports.Exited(exit1)
	h.clk.Advance(2 * time.Second)
	h.last("c0").reports.Ready("")
	h.last("c0").reports.Settled()
	h.clk.Advance(time.Minute - time.Millisecond)
	h.last("c0").reports.Exited(exit1) // 1 ms short: attempt 3, 4 s
	if next, _ := h.clk.Next(); next != 4*time.Second {
		t.Fatalf("restart delay = %v; want 4s (budget not reset yet)", next)
	}
	h.clk.Advance(4 * time.Second)
	h.last("c0").reports.Ready("")
	h.last("c0").reports.Settled()
	h.clk.Advance(time.Minute)
	if i := h.j.index(0, "restart budget reset", "child=c0"); i < 0 {
		t.Fatal("budget reset not logged")
	}
	h.last("c0").reports.Exited(exit1)
	h.wantState("c0", Restarting)
	if next, _ := h.clk.Next(); next != time.Second {
		t.Fatalf("restart delay = %v; want 1s after the healthy reset", next)
	}
	h.clk.Advance(time.Second)
	if l := h.last("c0").launch; l.Attempt != 1 {
		t.Fatalf("attempt = %d; want 1", l.Attempt)
	}
	closeHarness(h)
}

// closeHarness closes the supervisor, its fake children exiting on
// SIGTERM.
func closeHarness(h *harness) {
	done := make(chan struct{})
	go func() { h.s.Close(); close(done) }()
	for _, c := range h.s.Children() {
		for c.State == Starting || c.State == Running {
			c = h.state(c.ID)
		}
		if c.State == Stopping {
			h.last(c.ID).reports.Exited(nil)
		}
	}
	<-done
}

// TestStartupTimeout: a child not ready within the startup timeout is
// stopped, logged first, and counts as a failure.
func TestStartupTimeout(t *testing.T) {
	a, _ := ByProcesses(4, 1)
	h := newHarness(t, a, DefaultPolicy)
	h.s.Start()
	h.clk.Advance(30 * time.Second)
	h.wantState("c0", Stopping)
	logged := h.j.index(0, "startup timeout", "child=c0")
	signalled := h.j.index(0, "signal c0 gen 1 terminated")
	if logged < 0 || signalled < logged {
		t.Fatalf("startup timeout logged at %d, SIGTERM at %d", logged, signalled)
	}
	h.last("c0").reports.Exited(errors.New("signal: terminated"))
	h.wantState("c0", Restarting)
	h.clk.Advance(time.Second)
	h.wantState("c0", Starting)
	closeHarness(h)
}

// TestIgnoresSIGTERM: a child that does not exit after SIGTERM is killed
// after the shutdown timeout, logged before.
func TestIgnoresSIGTERM(t *testing.T) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	done := make(chan struct{})
	go func() { h.s.Close(); close(done) }()
	for h.state("a").State != Stopping || h.state("b").State != Stopping {
	}
	h.last("b").reports.Exited(nil) // b obeys at once
	h.clk.Advance(DefaultPolicy.ShutdownTimeout - time.Millisecond)
	if got := h.last("a").got(); !slices.Equal(got, []os.Signal{syscall.SIGTERM}) {
		t.Fatalf("a got %v before the timeout; want [SIGTERM]", got)
	}
	h.clk.Advance(time.Millisecond)
	if got := h.last("a").got(); !slices.Equal(got, []os.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Fatalf("a got %v; want SIGTERM then SIGKILL", got)
	}
	logged := h.j.index(0, "forced termination", "child=a")
	killed := h.j.index(0, "signal a gen 1 killed")
	if logged < 0 || killed < logged {
		t.Fatalf("forced termination logged at %d, SIGKILL at %d", logged, killed)
	}
	if h.j.index(0, "signal b gen 1 killed") >= 0 {
		t.Fatal("b was killed though it exited")
	}
	h.last("a").reports.Exited(errors.New("signal: killed"))
	<-done
	if h.s.Err() != nil {
		t.Fatalf("Err() = %v after a clean Close", h.s.Err())
	}
}

// TestRestartAll: the children restart one at a time, the next only after
// the previous one's shards are READY; at no time are two of them down.
func TestRestartAll(t *testing.T) {
	a, _ := ByProcesses(12, 3)
	h := newHarness(t, a, DefaultPolicy)
	h.s.Start()
	for _, id := range []string{"c0", "c1", "c2"} {
		h.last(id).reports.Ready("")
		h.last(id).reports.Settled()
	}
	if err := h.s.RestartAll(); err != nil {
		t.Fatal(err)
	}
	if err := h.s.RestartAll(); !errors.Is(err, ErrBusy) {
		t.Fatalf("second RestartAll = %v; want ErrBusy", err)
	}
	if err := h.s.Restart("c2"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Restart during restart all = %v; want ErrBusy", err)
	}
	for i, id := range []string{"c0", "c1", "c2"} {
		down := 0
		for _, c := range h.s.Children() {
			if c.State != Running {
				down++
			}
		}
		if down != 1 || h.state(id).State != Stopping {
			t.Fatalf("step %d: %v; want only %s stopping", i, h.s.Children(), id)
		}
		old := h.last(id)
		old.reports.Exited(nil)
		h.wantState(id, Starting)
		// A late report of the old generation changes nothing.
		old.reports.Ready("")
		h.wantState(id, Starting)
		h.last(id).reports.Ready("")
		if i < 2 && h.state([]string{"c0", "c1", "c2"}[i+1]).State != Running {
			t.Fatalf("the next child was touched before %s's shards were READY", id)
		}
		h.last(id).reports.Settled()
		if c := h.state(id); c.Generation != 2 || c.Restarts != 1 {
			t.Fatalf("%s = %v; want generation 2, 1 restart", id, c)
		}
	}
	if h.j.index(0, "restart all done") < 0 {
		t.Fatal("restart all did not finish")
	}
	if err := h.s.Restart("nope"); !errors.Is(err, ErrUnknownChild) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("Restart(nope) = %v", err)
	}
	closeHarness(h)
}

// TestRestartAllStopsOnUnsettledChild: a child whose shards are not READY
// within the startup timeout after its restart ends the rollout there.
func TestRestartAllStopsOnUnsettledChild(t *testing.T) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	for _, id := range []string{"a", "b"} {
		h.last(id).reports.Ready("")
		h.last(id).reports.Settled()
	}
	h.s.RestartAll()
	h.last("a").reports.Exited(nil)
	h.last("a").reports.Ready("")
	h.clk.Advance(30 * time.Second)
	if h.j.index(0, "restart all stopped", "child=a", "not_restarted=[b]") < 0 {
		t.Fatal("the stopped rollout was not logged")
	}
	h.wantState("b", Running)
	if c := h.state("b"); c.Generation != 1 {
		t.Fatalf("b = %v; want it untouched", c)
	}
	if err := h.s.Restart("b"); err != nil {
		t.Fatalf("Restart(b) after the stopped rollout = %v", err)
	}
	closeHarness(h)
}

// TestBrokenChannel: a child whose channel fails is stopped and restarted
// under the policy; the other child is not touched.
func TestBrokenChannel(t *testing.T) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	h.last("a").reports.Ready("")
	h.last("b").reports.Ready("")
	h.last("a").reports.Broken(errors.New(`garbage on the channel: "\x00\x01"`))
	if h.j.index(0, "private channel failed", "child=a", "garbage") < 0 {
		t.Fatal("the broken channel was not logged naming the child")
	}
	h.wantState("a", Stopping)
	h.last("a").reports.Exited(errors.New("signal: terminated"))
	h.wantState("a", Restarting)
	h.wantState("b", Running)
	if got := h.last("b").got(); len(got) != 0 {
		t.Fatalf("b got signals %v", got)
	}
	closeHarness(h)
}

// TestLaunchFails: a child that cannot be started counts as a failure.
func TestLaunchFails(t *testing.T) {
	pol := DefaultPolicy
	pol.MaxAttempts = 1
	a, _ := ByProcesses(4, 1)
	h := newHarness(t, a, pol)
	h.fail["c0"] = errors.New("fork/exec: no such file")
	h.s.Start()
	h.wantState("c0", Restarting)
	h.clk.Advance(time.Second)
	h.wantState("c0", Failed)
	if !h.done() {
		t.Fatal("not done")
	}
	if err := h.s.Err(); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("Err() = %v", err)
	}
}

func TestChildrenLine(t *testing.T) {
	c := ChildInfo{ID: "a", State: Running, Pid: 42, Restarts: 2, Generation: 3, Shards: []int{0, 1, 2, 3, 7}, Silent: 1250 * time.Millisecond}
	if got, want := c.String(), "a running 42 2 3 0-3,7 none 1.2s"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
	c.Pid, c.LastExitWord = 0, "watchdog:SIGKILL"
	if got, want := c.String(), "a running none 2 3 0-3,7 watchdog:SIGKILL none"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
}

// TestKilledStopIsNotClean: a restart whose child obeys SIGTERM is clean
// (the next start trusts its saved sessions); one that needed SIGKILL is
// not: the child may have saved sessions past the parent's last line, so
// the next start is told Crashed, and the parent's resume points replace
// its snapshots.
func TestKilledStopIsNotClean(t *testing.T) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	h.last("a").reports.Ready("")
	if err := h.s.Restart("a"); err != nil {
		t.Fatal(err)
	}
	h.last("a").reports.Exited(nil) // obeys SIGTERM
	if l := h.launchesOf("a"); len(l) != 2 || l[1].Crashed {
		t.Fatalf("launches after a clean restart: %+v; want a second one, not crashed", l)
	}
	h.last("a").reports.Ready("")
	if err := h.s.Restart("a"); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(DefaultPolicy.ShutdownTimeout)
	if got := h.last("a").got(); !slices.Equal(got, []os.Signal{syscall.SIGTERM, syscall.SIGKILL}) {
		t.Fatalf("a got %v; want SIGTERM then SIGKILL", got)
	}
	h.last("a").reports.Exited(errors.New("signal: killed"))
	if l := h.launchesOf("a"); len(l) != 3 || !l[2].Crashed {
		t.Fatalf("launches after a restart that needed SIGKILL: %+v; want a third one, crashed", l)
	}
	h.last("a").reports.Ready("")
	if err := h.s.Restart("a"); err != nil {
		t.Fatal(err)
	}
	h.last("a").reports.Exited(nil)
	if l := h.launchesOf("a"); len(l) != 4 || l[3].Crashed {
		t.Fatalf("a clean restart after a killed one: %+v; want not crashed", l)
	}
	h.s.closeAllForTest()
}

// TestCrashDuringStopIsCrash: a child that exits non-zero while it stops
// for its restart is a crash: the next start is told Crashed (its
// snapshots may be past the parent's last line), and /children says how
// it ended; a clean exit of the same stop is not.
func TestCrashDuringStopIsCrash(t *testing.T) {
	h := newHarness(t, twoChildren(t), DefaultPolicy)
	h.s.Start()
	h.last("a").reports.Ready("")
	if err := h.s.Restart("a"); err != nil {
		t.Fatal(err)
	}
	h.last("a").reports.Exited(nil)
	if l := h.last("a").launch; l.Crashed {
		t.Fatalf("after a clean stop, launch = %+v; want not Crashed", l)
	}
	h.last("a").reports.Ready("")
	if err := h.s.Restart("a"); err != nil {
		t.Fatal(err)
	}
	h.last("a").reports.Exited(errors.New("exit status 2"))
	if l := h.last("a").launch; !l.Crashed || l.Generation != 3 {
		t.Fatalf("after a crash during the stop, launch = %+v; want generation 3, Crashed", l)
	}
	if i := h.j.index(0, "crashed while it stopped", "child=a"); i < 0 {
		t.Error("the crash during the stop was not logged")
	}
	closeHarness(h)
}
