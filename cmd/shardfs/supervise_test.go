package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sfclient "github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

type superviseProc struct{ *serveProc }

// startSupervise runs `supervise` against sim and waits, at most 30 s,
// for the parent's TCP listener.
func startSupervise(t *testing.T, sim *gatewaysim.Server, token string, args ...string) *superviseProc {
	t.Helper()
	base := []string{"supervise", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto",
		"--max-concurrency", strconv.Itoa(sim.Config().MaxConcurrency), "--listen", "tcp!127.0.0.1!0,insecure", "--backoff", "fixed:100ms"}
	return &superviseProc{startProc(t, binDir(t), token, syscall.SIGTERM, append(base, args...)...)}
}

func (p *superviseProc) children(t *testing.T) map[string][]string {
	t.Helper()
	text, err := dotlRead(p.root, "children")
	if err != nil {
		t.Fatalf("read children: %v", err)
	}
	out := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(l)
		if len(f) != 8 {
			t.Fatalf("children line %q: want id state pid restarts generation shards last_exit silent", l)
		}
		out[f[0]] = f[1:]
	}
	return out
}

func (p *superviseProc) waitReady(t *testing.T, shards int) {
	t.Helper()
	eventually(t, "every shard READY through the parent", func() (bool, string) {
		s, err := dotlRead(p.root, "status")
		return err == nil && strings.Count(s, " READY ") == shards, s
	})
}

// TestSuperviseKillRestart: kill -9 of one child under traffic: it comes
// back within the policy and its shards are READY again, the other
// child's shards never reconnect, /children shows the restart; then
// `restart all` under traffic: every message once in the parent's
// /dispatch, every shard resumed (no new identify), one child down at a
// time; SIGTERM ends everything with status 0 and the token never shows.
func TestSuperviseKillRestart(t *testing.T) {
	const token = "SUPERVISE-TOKEN-never-print-9876"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 4, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := startSupervise(t, sim, token, "--processes", "2")
	p.waitReady(t, 4)
	ch := p.children(t)
	if ch["c0"][0] != "running" || ch["c1"][0] != "running" || ch["c0"][4] != "0-1" || ch["c1"][4] != "2-3" {
		t.Fatalf("children = %v", ch)
	}
	if s, _ := dotlRead(p.root, "2/state"); s != "READY\n" {
		t.Fatalf("2/state through the parent = %q", s)
	}

	// Commands through the parent: a node command reaches the owning
	// child, a shard's ctl is forwarded, a bad line is refused.
	if err := writeFile(p.root, "ctl", "stop 3\n"); err != nil {
		t.Fatalf("stop 3: %v", err)
	}
	eventually(t, "3 STOPPED", func() (bool, string) { s, _ := dotlRead(p.root, "3/state"); return s == "STOPPED\n", s })
	if err := writeFile(p.root, "3/ctl", "start\n"); err != nil {
		t.Fatalf("3/ctl start: %v", err)
	}
	eventually(t, "3 READY again", func() (bool, string) { s, _ := dotlRead(p.root, "3/state"); return s == "READY\n", s })
	if err := writeFile(p.root, "ctl", "frob\n"); err == nil {
		t.Error("frob on the parent's ctl was accepted")
	}
	if err := writeFile(p.root, "ctl", "restart nobody\n"); err == nil {
		t.Error("restart of an unknown child was accepted")
	}
	first := publishAny(t, sim, 4, 5, "a")
	waitIDs(t, p.root, first)
	pid, _ := strconv.Atoi(ch["c1"][1])
	identifies := sim.Totals().Identifies
	// Messages in flight at the kill, and while the child is down: the
	// new child resumes from the last sequence the parent has, and the
	// gateway replays the rest once.
	first = append(first, publishAny(t, sim, 4, 5, "k")...)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first = append(first, publishAny(t, sim, 4, 5, "d")...)
	eventually(t, "c1 restarted", func() (bool, string) {
		c := p.children(t)["c1"]
		return c[0] == "running" && c[2] == "1" && c[1] != strconv.Itoa(pid), fmt.Sprint(c)
	})
	p.waitReady(t, 4)
	if n := sim.Totals().Identifies; n != identifies {
		t.Errorf("the crashed child's shards spent %d identifies; want 0 (they resume)", n-identifies)
	}
	for _, sh := range []string{"0", "1"} {
		if r, _ := dotlRead(p.root, sh+"/reconnects"); r != "0\n" {
			t.Errorf("shard %s of the other child: reconnects %q; want 0", sh, r)
		}
	}
	if c := p.children(t)["c0"]; c[1] != ch["c0"][1] || c[2] != "0" {
		t.Errorf("c0 = %v; want it untouched (pid %s)", c, ch["c0"][1])
	}
	m, err := dotlRead(p.root, "metrics")
	if err != nil {
		t.Fatalf("read metrics: %v", err)
	}
	for _, want := range []string{`shardfs_supervisor_restarts_total{child="c1"} 1`, `shardfs_supervisor_children{state="running"} 2`, `child="c0"`, `child="c1"`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	families := map[string]int{}
	for _, l := range strings.Split(m, "\n") {
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			families[strings.Fields(f)[0]]++
		}
	}
	for name, n := range families {
		if n != 1 {
			t.Errorf("/metrics has family %s %d times", name, n)
		}
	}
	if len(families) < 3 {
		t.Errorf("/metrics has %d families: %v", len(families), families)
	}
	if !strings.Contains(p.stderr.String(), "restarting child") || !strings.Contains(p.stderr.String(), "child=c1") {
		t.Errorf("the restart was not logged:\n%s", p.stderr)
	}

	// restart all under traffic: 50 messages a shard at each sample, so
	// that a stopping child still has lines to flush when it exits.
	identifies = sim.Totals().Identifies
	if err := writeFile(p.root, "ctl", "restart all\n"); err != nil {
		t.Fatalf("restart all: %v", err)
	}
	var during []string
	for i := range 10 {
		during = append(during, publishAny(t, sim, 4, 50, fmt.Sprintf("b%d", i))...)
		c := p.children(t)
		if c["c0"][0] != "running" && c["c1"][0] != "running" {
			t.Fatalf("both children down at once: %v", c)
		}
	}
	eventually(t, "restart all done", func() (bool, string) {
		c := p.children(t)
		return c["c0"][3] == "2" && c["c1"][3] == "3" && c["c0"][0] == "running" && c["c1"][0] == "running", fmt.Sprint(c)
	})
	p.waitReady(t, 4)
	last := publishAny(t, sim, 4, 3, "c")
	got := waitIDs(t, p.root, append(append(append([]string(nil), first...), during...), last...))
	for id, n := range got {
		if n != 1 {
			t.Errorf("message %s appears %d times in /dispatch", id, n)
		}
	}
	if n := sim.Totals().Identifies; n != identifies {
		t.Errorf("restart all spent %d identifies; want 0 (every shard resumes)", n-identifies)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("supervise exited with %v:\n%s", err, p.stderr)
	}
	if strings.Contains(p.stderr.String(), token) {
		t.Fatal("the token appeared on stderr")
	}
}

func writeFile(root *sfclient.Client, path, text string) error {
	return root.WriteFile(path, []byte(text))
}

// publishAny is publish for shards that may also hold a crashed child's
// session, still resumable in the simulator: at least one session must
// get each message.
func publishAny(t *testing.T, sim *gatewaysim.Server, shards, count int, prefix string) []string {
	t.Helper()
	return publishSized(t, sim, shards, count, prefix, 1)
}

// publishSized is publishAny with size bytes of content a message.
func publishSized(t *testing.T, sim *gatewaysim.Server, shards, count int, prefix string, size int) []string {
	t.Helper()
	var ids []string
	content := strings.Repeat("x", size)
	for sh := range shards {
		for i := range count {
			id := fmt.Sprintf("%s-%d-%d", prefix, sh, i)
			ev := gatewaysim.Event{Name: "MESSAGE_CREATE", Data: json.RawMessage(`{"id":"` + id + `","content":"` + content + `"}`)}
			if n, err := sim.Publish(sh, ev); err != nil || n < 1 {
				t.Fatalf("publish %s reached %d sessions (%v); want at least 1", id, n, err)
			}
			ids = append(ids, id)
		}
	}
	return ids
}

var paceShards = flag.Int("supervise.shards", 64, "shards of TestSuperviseIdentifyPacing (the issue's figure, 64, takes about 80 s)")

// TestSuperviseIdentifyPacing is the case: 4 children share the
// parent's pacer at max_concurrency 4, 64 shards. The simulator refuses
// no identify, each shard identifies once, and the buckets run side by
// side: read from the READY events in the parent's /events (each follows
// its identify by the gateway's answer), every bucket has 64/4 = 16
// rounds. One node's spacing is 5 s + the gateway's 50 ms identify margin
// from the writes (supervise spaces them so across children, from the
// writes the children report); the test logs the spacing it saw and
// fails only past twice that, which pacing every child's buckets one
// after the other would exceed: the spacing a loaded machine gives is
// measured in bench/, not judged here. The simulator tolerates 250 ms of
// early identifies: two children's frames read late by different amounts
// under load arrive closer than they were written (10 refusals of 64 at a
// load average of 19 without it).
func TestSuperviseIdentifyPacing(t *testing.T) {
	const token = "PACING-TOKEN-1234"
	const mc = 4
	shards := *paceShards
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: shards, MaxConcurrency: mc, IdentifyTolerance: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := startSupervise(t, sim, token, "--processes", "4")
	rounds := (shards + mc - 1) / mc
	p.waitReadyWithin(t, shards, time.Duration(rounds)*6*time.Second+30*time.Second)
	tot := sim.Totals()
	if tot.RefusedIdentifies != 0 {
		t.Errorf("the simulator refused %d identifies", tot.RefusedIdentifies)
	}
	if tot.Identifies != int64(shards) {
		t.Errorf("%d identifies for %d shards", tot.Identifies, shards)
	}
	events, err := dotlRead(p.root, "events")
	if err != nil {
		t.Fatal(err)
	}
	ready := map[int][]time.Time{} // by bucket
	for _, l := range strings.Split(events, "\n") {
		var ts string
		var shard int
		if n, _ := fmt.Sscanf(l, "ts=%s shard=%d event=ready", &ts, &shard); n != 2 || !strings.Contains(l, " event=ready ") {
			continue
		}
		at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", ts)
		if err != nil {
			t.Fatalf("event line %q: %v", l, err)
		}
		ready[shard%mc] = append(ready[shard%mc], at)
	}
	var first, last time.Time
	for bucket := range mc {
		times := ready[bucket]
		slices.SortFunc(times, time.Time.Compare)
		if len(times) != rounds {
			t.Fatalf("bucket %d: %d READY events; want %d", bucket, len(times), rounds)
		}
		mean := times[len(times)-1].Sub(times[0]) / time.Duration(rounds-1)
		t.Logf("bucket %d: %d rounds, %v apart on average", bucket, rounds, mean.Round(time.Millisecond))
		if mean > 2*(core.DiscordWindow+gateway.DefaultIdentifyMargin) {
			t.Errorf("bucket %d: rounds %v apart on average; want at most twice one node's 5 s + %v", bucket, mean, gateway.DefaultIdentifyMargin)
		}
		if first.IsZero() || times[0].Before(first) {
			first = times[0]
		}
		last = later(last, times[len(times)-1])
	}
	t.Logf("%d shards in 4 children at max_concurrency %d: first READY to last %v (one node's floor: %v)", shards, mc, last.Sub(first).Round(10*time.Millisecond), time.Duration(rounds-1)*core.DiscordWindow)
	if b, _ := dotlRead(p.root, "identify"); !strings.Contains(b, "max_concurrency 4\n") || !strings.Contains(b, "waiting 0\n") {
		t.Errorf("/identify = %q", b)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (p *superviseProc) waitReadyWithin(t *testing.T, shards int, d time.Duration) {
	t.Helper()
	err := poll.Until(t.Context(), fmt.Sprintf("%d shards READY", shards), d, 50*time.Millisecond, func() error {
		s, err := dotlRead(p.root, "status")
		if err != nil {
			return err
		}
		if strings.Count(s, " READY ") != shards {
			return fmt.Errorf("status %q", s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSuperviseCrashLoop: a child that cannot start (its sessions folder
// is a file) is restarted 3 times, then the parent stops the other child
// and exits non-zero naming the child and its last exit.
func TestSuperviseCrashLoop(t *testing.T) {
	const token = "CRASH-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sess := t.TempDir()
	if err := os.WriteFile(filepath.Join(sess, "bad"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSupervise(t, sim, token, "--assign", "good=0;bad=1", "--sessions", sess, "--restart-min-delay", "10ms", "--restart-max-delay", "40ms", "--fail-all")
	err = p.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("supervise exited with %v; want status 1:\n%s", err, p.stderr)
	}
	out := p.stderr.String()
	for _, want := range []string{
		`attempt=1 max=3 delay=10ms`, `attempt=2 max=3 delay=20ms`, `attempt=3 max=3 delay=40ms`,
		"restart budget exhausted", `shardfs: child "bad" failed: restarted 3 times in a row, last exit: exit status 1`,
		`msg="child stopped" component=supervisor child=good`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", out)
	}
}

// TestSuperviseBadInput: bad flags fail the parent at once, naming them.
func TestSuperviseBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--total", "8", "--assign", "a=0-3;b=3-7"}, `shard 3 is assigned to both "a" and "b"`},
		{[]string{"--total", "8", "--assign", "a=0-8"}, "shard 8 is outside the total of 8"},
		{[]string{"--total", "8", "--assign", "a=0-3;a=4-7"}, `child "a" is named twice`},
		{[]string{"--total", "8", "--assign", strings.Repeat("x", 129) + "=0"}, "over 128"},
		{[]string{"--total", "4", "--processes", "5"}, "--processes 5 is larger than the total of 4"},
		{[]string{"--total", "4"}, "want exactly one of"},
		{[]string{"--total", "4", "--processes", "2", "--shards-per-process", "2"}, "want exactly one of"},
		{[]string{"--total", "4", "--processes", "2", "--restart-max", "-1"}, "--restart-max -1"},
		{[]string{"--total", "4", "--processes", "2", "--restart-min-delay", "2s", "--restart-max-delay", "1s"}, "min <= max"},
		{[]string{"--total", "4", "--processes", "2", "--backoff", "nope"}, "--backoff"},
		{[]string{"--total", "4", "--processes", "2", "--identify-total", "-1"}, "--identify-total -1"},
		{[]string{"--total", "4", "--processes", "2", "--identify-reserve", "-2"}, "--identify-reserve -2"},
		{[]string{"--total", "4", "--processes", "2", "--resume-window", "-1s"}, "--resume-window"},
		{[]string{"--total", "4", "--processes", "2", "--etcd", "http://127.0.0.1:2379", "--bot", "b"}, "supervise with etcd is not supported yet"},
		{[]string{"--total", "4", "--processes", "2", "--etcd-ttl", "5s"}, "--etcd-ttl: supervise with etcd is not supported yet"},
		{[]string{"--total", "4", "--processes", "2", "--flavor", "fluxer", "--fluxer-identify-budget", "100"}, "--fluxer-identify-budget: supervise with etcd is not supported yet"},
		{[]string{"--total", "4", "--processes", "2", "--shards", "0-1"}, "--shards: supervise gives each child its block"},
	} {
		var errb strings.Builder
		args := append([]string{"supervise", "--flavor", "discord"}, tc.args...)
		err := run(t.Context(), args, strings.NewReader(""), io.Discard, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("shardfs %v = %v; want an error containing %q", tc.args, err, tc.want)
		}
	}
}

var restartAllShards = flag.Int("supervise.restart-all", 0, "shards of TestSuperviseRestartAllTime (skipped at 0; the issue's figure is 1024, about 6 minutes cold at max_concurrency 16)")

// TestSuperviseRestartAllTime measures `restart all` of 4 children with
// many shards, each resuming: run with -supervise.restart-all 1024.
func TestSuperviseRestartAllTime(t *testing.T) {
	shards := *restartAllShards
	if shards == 0 {
		t.Skip("a measurement: -supervise.restart-all N")
	}
	const token = "RESTART-ALL-TOKEN-1234"
	// Over 1,000 shards need a bot whose daily budget is larger than the
	// default 1,000 starts.
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: shards, MaxConcurrency: 16, SessionStartLimit: 4 * shards})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	start := time.Now()
	p := startSupervise(t, sim, token, "--processes", "4")
	p.waitReadyWithin(t, shards, time.Duration(shards/16)*6*time.Second+time.Minute)
	t.Logf("%d shards in 4 children at max_concurrency 16: READY in %v", shards, time.Since(start).Round(10*time.Millisecond))
	if n := sim.Totals().RefusedIdentifies; n != 0 {
		t.Errorf("the simulator refused %d identifies", n)
	}
	took, identifies := p.restartAll(t, sim)
	t.Logf("restart all of 4 children, %d shards: %v, %d identifies", shards, took.Round(10*time.Millisecond), identifies)
	p.waitReady(t, shards)
}

// restartAll writes restart all to the parent's ctl and waits, at most 5
// minutes, for the parent to log that it is done (after the last child's
// shards are READY). It returns how long that took and the identifies
// the simulator saw meanwhile.
func (p *superviseProc) restartAll(t *testing.T, sim *gatewaysim.Server) (time.Duration, int64) {
	t.Helper()
	identifies := sim.Totals().Identifies
	start := time.Now()
	if err := writeFile(p.root, "ctl", "restart all\n"); err != nil {
		t.Fatal(err)
	}
	err := poll.Until(t.Context(), "restart all done", 5*time.Minute, 50*time.Millisecond, func() error {
		if !strings.Contains(p.stderr.String(), "restart all done") {
			return errors.New("not in supervise's log")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start), sim.Totals().Identifies - identifies
}

// TestSuperviseExamples runs the shell examples against the parent's
// tree through the built-in client (the QEMU guest runs them against
// serve's tree): the scripts see one tree whatever serves it.
func TestSuperviseExamples(t *testing.T) {
	const token = "EXAMPLES-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 4, MaxConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := startSupervise(t, sim, token, "--processes", "2")
	tree := "9p!" + tcpListener(t, p.stderr)
	dir := binDir(t)
	run := func(env []string, script string, args ...string) string {
		t.Helper()
		return runExample(t, dir, env, script, args...)
	}
	run(nil, "wait-ready.sh", tree, "60")
	if out := run(nil, "watch-states.sh", tree, "0.2", "2"); strings.Count(out, "none -> READY") != 4 {
		t.Errorf("watch-states printed %q; want the 4 shards going READY", out)
	}
	ids := publishAny(t, sim, 4, 1, "ex")
	waitIDs(t, p.root, ids)
	if out := run(nil, "last-dispatch-types.sh", tree, "3"); out != "MESSAGE_CREATE\nMESSAGE_CREATE\nMESSAGE_CREATE\n" {
		t.Errorf("last-dispatch-types printed %q; want 3 MESSAGE_CREATE", out)
	}
	if out := run(nil, "reset-stuck.sh", tree, "0"); out != "" {
		t.Errorf("reset-stuck with every shard READY reset %q", out)
	}
	run([]string{"ROUNDS=1"}, "keep-lease.sh", tree, "30s", "1", "true")
	for _, sh := range []string{"0", "3"} {
		if d, _ := dotlRead(p.root, sh+"/diag"); !strings.Contains(d, "lease_deadline ") || strings.Contains(d, "lease_deadline none") {
			t.Errorf("after keep-lease.sh shard %s's diag has no lease deadline:\n%s", sh, d)
		}
	}
}

// TestSuperviseFluxer: with Fluxer, restart all resumes every shard, and
// a crashed child's shards start new sessions (the SDK's rule: Fluxer
// trims its replay buffer to what the dead child acknowledged).
func TestSuperviseFluxer(t *testing.T) {
	const token = "FLUXER-SUPERVISE-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Fluxer, Token: token, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := &superviseProc{startProc(t, binDir(t), token, syscall.SIGTERM, "supervise", "--flavor", "fluxer", "--api", sim.APIURL(), "--total", "2", "--processes", "2",
		"--listen", "tcp!127.0.0.1!0", "--backoff", "fixed:100ms")}
	p.waitReady(t, 2)
	identifies := sim.Totals().Identifies
	if err := writeFile(p.root, "ctl", "restart all\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "restart all done", func() (bool, string) {
		return strings.Contains(p.stderr.String(), "restart all done"), ""
	})
	p.waitReady(t, 2)
	if n := sim.Totals().Identifies; n != identifies {
		t.Errorf("restart all spent %d identifies; want 0", n-identifies)
	}
	pid, _ := strconv.Atoi(p.children(t)["c1"][1])
	syscall.Kill(pid, syscall.SIGKILL)
	eventually(t, "c1 back", func() (bool, string) {
		c := p.children(t)["c1"]
		return c[0] == "running" && c[1] != strconv.Itoa(pid), fmt.Sprint(c)
	})
	p.waitReady(t, 2)
	if n := sim.Totals().Identifies; n != identifies+1 {
		t.Errorf("after the crash: %d identifies; want 1 (a new session for the crashed child's shard)", n-identifies)
	}
	if strings.Contains(p.stderr.String(), "the crashed child's shards resume") {
		t.Error("a Fluxer crash was resumed")
	}
}

// TestSuperviseLongIDAndGap: a child with the longest ID allowed (128
// characters) is reached through the parent (its socket is named by its
// block's index: the ID in the path overflowed sun_path, and its shards
// read ASSIGNED through the parent); shard 2 is in no block, which the
// log and /plan name; a real child's environment and arguments hold no
// token.
func TestSuperviseLongIDAndGap(t *testing.T) {
	const token = "SUPERVISE-TOKEN-long-id-5555"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 3, MaxConcurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	long := strings.Repeat("x", 128)
	p := startSupervise(t, sim, token, "--assign", "good=0;"+long+"=1")
	p.waitReady(t, 2)
	if s, err := dotlRead(p.root, "1/state"); s != "READY\n" {
		t.Fatalf("1/state through the parent = %q, %v", s, err)
	}
	if err := writeFile(p.root, "1/ctl", "stop\n"); err != nil {
		t.Fatalf("1/ctl stop through the parent: %v", err)
	}
	eventually(t, "1 STOPPED", func() (bool, string) { s, _ := dotlRead(p.root, "1/state"); return s == "STOPPED\n", s })
	if m, _ := dotlRead(p.root, "metrics"); !strings.Contains(m, `child="`+long+`"`) {
		t.Errorf("/metrics has no sample of the long-named child")
	}
	if plan, _ := dotlRead(p.root, "plan"); !strings.Contains(plan, "unowned 2\n") {
		t.Errorf("/plan = %q; want it to name unowned shard 2", plan)
	}
	if out := p.stderr.String(); !strings.Contains(out, "in no child's block") || !strings.Contains(out, "unowned=2") {
		t.Errorf("the log does not name unowned shard 2:\n%s", out)
	}
	ch := p.children(t)
	for id, f := range ch {
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("child %q: pid %q", id, f[1])
		}
		for _, file := range []string{"environ", "cmdline"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
			if err != nil {
				t.Fatalf("child %q: %v", id, err)
			}
			if strings.Contains(string(b), token) || !strings.Contains(string(b), "SHARDFS") && file == "environ" {
				t.Errorf("child %q: /proc/%d/%s holds the token (or is not the child's)", id, pid, file)
			}
		}
	}
}

// TestSuperviseChildLimit: the parent's discovery fails (the first
// request to /gateway/bot gets a 502); the child's succeeds, and what it
// learnt (a budget of 40 starts) reaches the parent's shared pacer, which
// /identify shows: the parent enforces the budget without having
// discovered it.
func TestSuperviseChildLimit(t *testing.T) {
	const token = "SUPERVISE-TOKEN-limit-4242"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2, SessionStartLimit: 40})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	target, err := url.Parse(sim.APIURL())
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var failed atomic.Bool
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/gateway/bot") && failed.CompareAndSwap(false, true) {
			http.Error(w, "the parent's discovery fails", http.StatusBadGateway)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	defer api.Close()
	p := startSupervise(t, sim, token, "--api", api.URL, "--total", "2", "--processes", "1")
	p.waitReady(t, 2)
	if !strings.Contains(p.stderr.String(), "discovery before the start failed") {
		t.Fatalf("the parent's discovery did not fail:\n%s", p.stderr)
	}
	eventually(t, "the child's budget in the parent's /identify", func() (bool, string) {
		s, _ := dotlRead(p.root, "identify")
		return strings.Contains(s, "total 40\n") && !strings.Contains(s, "remaining unknown"), s
	})
}

var overheadShards = flag.Int("supervise.overhead", 0, "shards of TestSuperviseOverhead (skipped at 0; bench/RESULTS.md section 12 uses 1024)")
var (
	overheadMsgs = flag.Int("supervise.overhead-msgs", 20, "messages a shard in TestSuperviseOverhead")
	overheadSize = flag.Int("supervise.overhead-size", 1, "bytes of content a message in TestSuperviseOverhead")
)

// TestSuperviseOverhead measures, in one run, supervise (4 children)
// against one serve node, each on a simulator of its own with the same
// shards and traffic: the CPU time (utime+stime from /proc) per 9P read of
// /0/state through the parent and straight to the node, the resident
// memory of the parent, each child and the node after the traffic, and
// the time of `restart all`. Run with -supervise.overhead 1024.
func TestSuperviseOverhead(t *testing.T) {
	shards := *overheadShards
	if shards == 0 {
		t.Skip("a measurement: -supervise.overhead N")
	}
	const token = "OVERHEAD-TOKEN-1234"
	const mc = 64 // a quick start: the figures are about what follows
	newSim := func() *gatewaysim.Server {
		sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: shards, MaxConcurrency: mc, SessionStartLimit: 4 * shards})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		return sim
	}
	simP, simN := newSim(), newSim()
	p := startSupervise(t, simP, token, "--processes", "4")
	n := startNode(t, binDir(t), simN, token, t.TempDir())
	within := time.Duration(shards/mc)*6*time.Second + time.Minute
	p.waitReadyWithin(t, shards, within)
	eventually(t, "the node's shards READY", func() (bool, string) {
		s, err := dotlRead(n.root, "status")
		return err == nil && strings.Count(s, " READY ") == shards, ""
	})
	parent, node := p.cmd.Process.Pid, n.cmd.Process.Pid
	ch := p.children(t)

	// Traffic: the same messages on each side, shard after shard, until
	// the last one of the last shard of each child is in its /N/dispatch
	// (the node-wide /dispatch keeps 16 MiB only, and reading every
	// shard's is slow).
	perShard, size := *overheadMsgs, *overheadSize
	// The parent's CPU over the traffic: every line a child copies costs
	// it a read on the data stream and the appends to its logs.
	parentBefore, trafficStart := procCPU(t, parent), time.Now()
	publishSized(t, simP, shards, perShard, "p", size)
	publishSized(t, simN, shards, perShard, "n", size)
	var lastShards []int
	for _, f := range ch {
		ids, err := core.ParseShardList(f[4])
		if err != nil {
			t.Fatal(err)
		}
		lastShards = append(lastShards, ids[len(ids)-1])
	}
	for _, sh := range lastShards {
		for _, side := range []struct {
			root   *sfclient.Client
			prefix string
		}{{p.root, "p"}, {n.root, "n"}} {
			last := fmt.Sprintf(`"%s-%d-%d"`, side.prefix, sh, perShard-1)
			// Once a second: each look reads the shard's 256 KiB through
			// the parent, which the CPU figure of the traffic counts.
			err := poll.Until(t.Context(), fmt.Sprintf("%s in %d/dispatch", last, sh), 10*time.Minute, time.Second, func() error {
				d, err := dotlRead(side.root, strconv.Itoa(sh)+"/dispatch")
				if !strings.Contains(d, last) {
					return fmt.Errorf("%d bytes, %v", len(d), err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	trafficCPU, trafficTook := procCPU(t, parent)-parentBefore, time.Since(trafficStart)
	mem := fmt.Sprintf("after %d messages of %d bytes: parent %s, node %s", perShard*shards, size, procMem(t, parent), procMem(t, node))
	for _, id := range []string{"c0", "c1", "c2", "c3"} {
		pid, _ := strconv.Atoi(ch[id][1])
		mem += fmt.Sprintf(", child %s %s", id, procMem(t, pid))
	}
	t.Log("resident memory " + mem)
	pss, anon := procPss(t, parent), procAnon(t, parent)
	for _, id := range []string{"c0", "c1", "c2", "c3"} {
		pid, _ := strconv.Atoi(ch[id][1])
		pss, anon = pss+procPss(t, pid), anon+procAnon(t, pid)
	}
	t.Logf("parent and children together: Pss %d kB, anonymous %d kB; the node: Pss %d kB, anonymous %d kB (%.2fx and %.2fx)",
		pss, anon, procPss(t, node), procAnon(t, node), float64(pss)/float64(procPss(t, node)), float64(anon)/float64(procAnon(t, node)))

	// CPU per read: the parent's and c0's (which owns shard 0) through
	// the parent, the node's straight; each less the same process's CPU
	// over an idle interval as long (heartbeats, timers).
	const reads = 3000
	c0, _ := strconv.Atoi(ch["c0"][1])
	measure := func(root *sfclient.Client, pids ...int) ([]time.Duration, time.Duration) {
		before := make([]time.Duration, len(pids))
		for i, pid := range pids {
			before[i] = procCPU(t, pid)
		}
		start := time.Now()
		for range reads {
			if s, err := dotlRead(root, "0/state"); err != nil || s != "READY\n" {
				t.Fatalf("0/state = %q, %v", s, err)
			}
		}
		took := time.Since(start)
		out := make([]time.Duration, len(pids))
		for i, pid := range pids {
			out[i] = procCPU(t, pid) - before[i]
		}
		return out, took
	}
	idle := func(d time.Duration, pids ...int) []time.Duration {
		before := make([]time.Duration, len(pids))
		for i, pid := range pids {
			before[i] = procCPU(t, pid)
		}
		time.Sleep(d) // a measurement interval, not a wait for a state
		out := make([]time.Duration, len(pids))
		for i, pid := range pids {
			out[i] = procCPU(t, pid) - before[i]
		}
		return out
	}
	viaParent, tookP := measure(p.root, parent, c0)
	idleP := idle(tookP, parent, c0)
	direct, tookN := measure(n.root, node)
	idleN := idle(tookN, node)
	per := func(busy, quiet time.Duration) time.Duration { return (busy - quiet) / reads }
	t.Logf("CPU per read of 0/state (%d reads, 10 ms ticks): through the parent: parent %v + child %v (idle parent %v, child %v over %v); straight to the node: %v (idle %v over %v)",
		reads, per(viaParent[0], idleP[0]), per(viaParent[1], idleP[1]), idleP[0], idleP[1], tookP.Round(time.Millisecond), per(direct[0], idleN[0]), idleN[0], tookN.Round(time.Millisecond))
	t.Logf("wall time per read: through the parent %v, straight %v", tookP/reads, tookN/reads)
	idleRate := float64(idleP[0]) / float64(tookP)
	lines := shards * perShard
	t.Logf("parent CPU over the traffic (%d dispatch lines of about %d bytes copied in %v, 10 ms ticks): %v, less %v idle: %v per line",
		lines, size, trafficTook.Round(time.Millisecond), trafficCPU, time.Duration(idleRate*float64(trafficTook)).Round(time.Millisecond),
		(trafficCPU-time.Duration(idleRate*float64(trafficTook)))/time.Duration(lines))

	took, identifies := p.restartAll(t, simP)
	t.Logf("restart all of 4 children, %d shards: %v, %d identifies; parent after it %s", shards, took.Round(10*time.Millisecond), identifies, procMem(t, parent))
	p.waitReady(t, shards)

	// A hung child: SIGSTOP of c1, detected by the watchdog (the default
	// 10 s), killed and started again; its shards READY again.
	ch = p.children(t)
	hung, _ := strconv.Atoi(ch["c1"][1])
	stopped := time.Now()
	if err := syscall.Kill(hung, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	err := poll.Until(t.Context(), "c1 hung, killed and running again", 5*time.Minute, 100*time.Millisecond, func() error {
		c := p.children(t)["c1"]
		if c[0] != "running" || c[1] == strconv.Itoa(hung) {
			return fmt.Errorf("c1: %v", c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	running := time.Since(stopped)
	p.waitReadyWithin(t, shards, 5*time.Minute)
	t.Logf("hung child (SIGSTOP of c1, --watchdog 10s): running again after %v, every shard READY after %v", running.Round(10*time.Millisecond), time.Since(stopped).Round(10*time.Millisecond))
}

// procCPU is a process's user and system CPU time so far, from
// /proc/PID/stat (in clock ticks of 10 ms).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// procMem is a process's resident memory and its peak, from
// /proc/PID/status.
func procMem(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rss, hwm string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rss = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			hwm = strings.TrimSpace(v)
		}
	}
	return fmt.Sprintf("RSS %s (peak %s, Pss %d kB, anonymous %d kB)", rss, hwm, procPss(t, pid), procAnon(t, pid))
}

// procPss is a process's proportional set size in kB, from
// /proc/PID/smaps_rollup: the pages it shares with others (the binary's
// text, which the parent and its children all map) counted in part, so
// that the figures of several processes add up to what they hold.
func procPss(t *testing.T, pid int) int {
	return smapsRollup(t, pid, "Pss:")
}

// procAnon is a process's anonymous resident memory in kB (its heap and
// stacks: what it holds of its own).
func procAnon(t *testing.T, pid int) int {
	return smapsRollup(t, pid, "Anonymous:")
}

func smapsRollup(t *testing.T, pid int, key string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// The parent's stderr is a pipe whose reader is gone (`supervise | tee`,
// tee killed): the parent keeps running and keeps its children, and ends
// on SIGTERM by its own exit, not by SIGPIPE (the attack on issue 23 saw
// it die with status 141).
func TestSuperviseDeadStderrReader(t *testing.T) {
	const token = "SIGPIPE-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sock := filepath.Join(t.TempDir(), "sup.sock")
	cmd := command(t, binDir(t), "supervise", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto",
		"--max-concurrency", "2", "--listen", "unix!"+sock, "--backoff", "fixed:100ms", "--processes", "2")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the reader is gone before the first line
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	eventually(t, "both shards READY through the parent", func() (bool, string) {
		select {
		case err := <-exited:
			t.Fatalf("supervise exited with its stderr's reader gone: %v", err)
		default:
		}
		c, err := sfclient.Dial(t.Context(), "unix!"+sock)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		s, err := c.ReadFile("status")
		return err == nil && strings.Count(string(s), " READY ") == 2, string(s)
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("supervise with a dead stderr reader ended with %v; want a clean exit", err)
	}
}
