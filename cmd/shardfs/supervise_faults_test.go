package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sfclient "github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
	"github.com/shardfs/shardfs/sessions/dir"
)

// answersWithin is the bound on a read of a file of a child that
// is not the hung one: the parent answers it from its cache.
const answersWithin = 2 * time.Second

// TestSuperviseHungChild: SIGSTOP of one child under traffic. Every read
// of the other child's files and of the node files answers within 2 s
// (the hung child's state, sequence and reconnects too, from the parent's
// cache); the healthy child's messages all reach /dispatch, in order; the
// stopped child becomes hung past the watchdog, is killed and restarted
// (/children says watchdog:SIGKILL), and its shards come back READY.
func TestSuperviseHungChild(t *testing.T) {
	const token = "HUNG-TOKEN-never-print-4321"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 4, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := startSupervise(t, sim, token, "--processes", "2", "--watchdog", "3s")
	p.waitReady(t, 4)
	ch := p.children(t)
	pid, _ := strconv.Atoi(ch["c1"][1])
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer syscall.Kill(pid, syscall.SIGCONT) // a failed test leaves no stopped process

	// Reads under traffic while c1 is stopped, until it is restarted.
	var (
		mu   sync.Mutex
		slow []string
		sent []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, path := range []string{"0/state", "1/sequence", "0/reconnects", "status", "children", "2/state", "3/sequence", "identify"} {
				start := time.Now()
				_, err := dotlRead(p.root, path)
				if d := time.Since(start); err != nil || d > answersWithin {
					mu.Lock()
					slow = append(slow, fmt.Sprintf("%s: %v in %v", path, err, d))
					mu.Unlock()
				}
			}
		}
	})
	for i := range 20 {
		sent = append(sent, publishAny(t, sim, 2, 1, fmt.Sprintf("h%d", i))...)
	}
	eventually(t, "c1 hung, killed and restarted", func() (bool, string) {
		c := p.children(t)["c1"]
		return c[0] == "running" && c[1] != strconv.Itoa(pid) && c[5] == "watchdog:SIGKILL", fmt.Sprint(c)
	})
	t.Logf("SIGSTOP to the new c1 running: %v (watchdog 3s, polled every 100 ms)", time.Since(stopped).Round(10*time.Millisecond))
	close(stop)
	wg.Wait()
	for _, s := range slow {
		t.Errorf("a read while c1 was stopped: %s; want an answer within %v", s, answersWithin)
	}
	p.waitReady(t, 4)
	t.Logf("SIGSTOP to every shard READY again: %v", time.Since(stopped).Round(10*time.Millisecond))
	got := waitIDs(t, p.root, sent)
	for _, id := range sent {
		if got[id] != 1 {
			t.Errorf("message %s appears %d times in /dispatch; want 1", id, got[id])
		}
	}
	// In order: each shard's messages in the order they were published.
	next := map[int]int{}
	for _, l := range readDispatch(t, p.root, "dispatch") {
		var m struct {
			ID string `json:"id"`
		}
		if l.T != "MESSAGE_CREATE" || json.Unmarshal(l.D, &m) != nil || !strings.HasPrefix(m.ID, "h") {
			continue
		}
		var i, sh, n int
		if _, err := fmt.Sscanf(m.ID, "h%d-%d-%d", &i, &sh, &n); err != nil {
			continue
		}
		if i != next[sh] {
			t.Errorf("shard %d: message %s at the place of h%d", sh, m.ID, next[sh])
		}
		next[sh] = i + 1
	}
	for _, sh := range []string{"0", "1"} {
		if r, _ := dotlRead(p.root, sh+"/reconnects"); r != "0\n" {
			t.Errorf("shard %s of the healthy child: reconnects %q; want 0", sh, r)
		}
	}
	if !strings.Contains(p.stderr.String(), "child hung") {
		t.Errorf("the hang was not logged")
	}
	if m, _ := dotlRead(p.root, "metrics"); !strings.Contains(m, `shardfs_supervisor_hangs_total{child="c1"} 1`) || !strings.Contains(m, `shardfs_supervisor_hangs_total{child="c0"} 0`) {
		t.Errorf("/metrics does not count the hang:\n%s", m)
	}
}

// TestSuperviseCrashLoopAlone: a child that cannot start ends failed
// alone; the other child's shard sees no reconnect and supervise goes on
// serving it.
func TestSuperviseCrashLoopAlone(t *testing.T) {
	const token = "CRASH-ALONE-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sess := t.TempDir()
	if err := os.WriteFile(filepath.Join(sess, "bad"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSupervise(t, sim, token, "--assign", "good=0;bad=1", "--sessions", sess, "--restart-min-delay", "10ms", "--restart-max-delay", "40ms")
	eventually(t, "bad failed, good running with its shard READY", func() (bool, string) {
		c := p.children(t)
		s, _ := dotlRead(p.root, "0/state")
		return c["bad"][0] == "failed" && c["good"][0] == "running" && s == "READY\n", fmt.Sprint(c, s)
	})
	if c := p.children(t)["bad"]; c[5] != "exit:1" || c[2] != "3" {
		t.Errorf("bad = %v; want 3 restarts, last_exit exit:1", c)
	}
	if r, _ := dotlRead(p.root, "0/reconnects"); r != "0\n" {
		t.Errorf("0/reconnects = %q; want 0", r)
	}
	ids := publishAny(t, sim, 1, 3, "alone")
	waitIDs(t, p.root, ids)
	if s, _ := dotlRead(p.root, "1/state"); s != "ASSIGNED\n" {
		t.Errorf("1/state of the failed child = %q; want ASSIGNED", s)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("supervise exited with %v; want 0 (one child failed alone):\n%s", err, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "the others go on") {
		t.Errorf("stderr does not say the others go on")
	}
}

// gone: pid has exited (a zombie counts: nobody runs as it).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// killOrphaning kills the supervise with SIGKILL and waits (a minute at
// most) for its children, orphaned, to save and exit.
func (p *superviseProc) killOrphaning(t *testing.T) {
	t.Helper()
	var pids []int
	for _, c := range p.children(t) {
		pid, _ := strconv.Atoi(c[1])
		pids = append(pids, pid)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	err := poll.Until(t.Context(), "every orphaned child exited", time.Minute, 50*time.Millisecond, func() error {
		for _, pid := range pids {
			if !gone(pid) {
				return fmt.Errorf("child %d still runs", pid)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSuperviseParentKilled: the parent killed with SIGKILL under traffic.
// Every child sees its channel end, saves its sessions and exits (bounded:
// a minute); a new supervise on the same --sessions resumes every shard,
// with no identify and no second live session.
func TestSuperviseParentKilled(t *testing.T) {
	const token = "ORPHAN-TOKEN-never-print-5555"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 4, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sess := t.TempDir()
	p := startSupervise(t, sim, token, "--processes", "2", "--sessions", sess)
	p.waitReady(t, 4)
	identifies := sim.Totals().Identifies
	publishAny(t, sim, 4, 5, "o")
	p.killOrphaning(t)
	for _, c := range []string{"c0", "c1"} {
		files, _ := filepath.Glob(filepath.Join(sess, c, "shard-*.json"))
		if len(files) != 2 {
			t.Errorf("child %s saved %d sessions; want 2", c, len(files))
		}
	}
	waitNoLiveSessions(t, sim)
	q := startSupervise(t, sim, token, "--processes", "2", "--sessions", sess)
	q.waitReady(t, 4)
	if n := sim.Totals().Identifies; n != identifies {
		t.Errorf("the new supervise spent %d identifies; want 0 (every shard resumes)", n-identifies)
	}
	if n := sim.Totals().LiveSessions; n != 4 {
		t.Errorf("%d live sessions; want 4", n)
	}
	q.cmd.Process.Signal(syscall.SIGTERM)
	if err := q.cmd.Wait(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("the second supervise exited with %v", err)
	}
}

// TestSuperviseKilledParentSpacing: while a supervise runs, a second one
// on the same --sessions is refused at once, naming the first; then the
// first is killed (SIGKILL) just after its shards identified, its
// children save and exit, their snapshots are removed, and a new
// supervise on the same --sessions identifies every shard again: each
// bucket's first identify comes no sooner than 5 s after the
// predecessor's last (identify-times.json), and the gateway refuses none.
func TestSuperviseKilledParentSpacing(t *testing.T) {
	const token = "SPACING-TOKEN-never-print-5555"
	// One shard a bucket: the new supervise's write in each bucket is its
	// first there.
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sess := t.TempDir()
	p := startSupervise(t, sim, token, "--processes", "2", "--sessions", sess)
	p.waitReady(t, 2)

	second := command(t, binDir(t), "supervise", "--flavor", "discord", "--api", sim.APIURL(), "--total", "2", "--processes", "2",
		"--listen", "tcp!127.0.0.1!0,insecure", "--sessions", sess)
	second.Env = append(second.Env, "SHARDFS_TOKEN="+token)
	out, err := second.CombinedOutput() // refused before it listens or starts a child
	if want := fmt.Sprintf("in use by another supervise (process %d)", p.cmd.Process.Pid); err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a second supervise on the same --sessions: %v, output:\n%s\nwant a failure saying %q", err, out, want)
	}

	before, err := dir.LoadIdentifyTimes(sess)
	if err != nil || len(before.Written) != 2 {
		t.Fatalf("identify-times.json after the first start = %+v, %v; want both buckets", before, err)
	}
	p.killOrphaning(t)
	snaps, _ := filepath.Glob(filepath.Join(sess, "*", "shard-*.json"))
	for _, f := range snaps {
		os.Remove(f) // the new supervise must identify
	}
	totals := sim.Totals()
	q := startSupervise(t, sim, token, "--processes", "2", "--sessions", sess)
	q.waitReady(t, 2)
	after := sim.Totals()
	if n := after.Identifies - totals.Identifies; n != 2 {
		t.Errorf("the new supervise identified %d times; want 2 (its snapshots were removed)", n)
	}
	if n := after.RefusedIdentifies - totals.RefusedIdentifies; n != 0 {
		t.Errorf("the gateway refused %d of the new supervise's identifies (too close to the predecessor's); want 0", n)
	}
	now, err := dir.LoadIdentifyTimes(sess)
	if err != nil {
		t.Fatal(err)
	}
	for bucket, prev := range before.Written {
		if gap := now.Written[bucket].Sub(prev); gap < core.DiscordWindow {
			t.Errorf("bucket %d: the new supervise identified %v after its predecessor; want at least %v", bucket, gap, core.DiscordWindow)
		} else {
			t.Logf("bucket %d: the new supervise identified %v after its predecessor", bucket, gap)
		}
	}
	q.cmd.Process.Signal(syscall.SIGTERM)
	if err := q.cmd.Wait(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("the new supervise exited with %v", err)
	}
}

// TestSuperviseGapCrash: the parent is stopped (SIGSTOP) while shard 0
// gets 6 MB of dispatch: its child's 1 MiB transit buffer drops lines.
// Once the parent runs again, every line of shard 0 is either in its
// /dispatch or counted in a gap line that names shard 0; the child is
// then killed, and after its restart shard 0 identifies (its copy has a
// hole) while shard 1, of the same child, resumes.
func TestSuperviseGapCrash(t *testing.T) {
	const token = "GAP-TOKEN-never-print-5555"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 4, MaxConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	p := startSupervise(t, sim, token, "--processes", "2")
	p.waitReady(t, 4)
	c0, _ := strconv.Atoi(p.children(t)["c0"][1])
	// The child's own tree, to see it took every line while its parent
	// stood still.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c0))
	if err != nil {
		t.Fatal(err)
	}
	var socket string
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		if s, ok := strings.CutPrefix(arg, "unix!"); ok {
			socket = s
		}
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatalf("dial child c0's tree at %q: %v", socket, err)
	}
	child, err := sfclient.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer child.Close()

	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	publishSized(t, sim, 1, 3000, "g", 2000)
	last := sim.Sessions(0)[0].Seq
	err = poll.Until(t.Context(), "child c0 took every line of shard 0", 2*time.Minute, 100*time.Millisecond, func() error {
		if s, err := dotlRead(child, "0/sequence"); err != nil || s != strconv.FormatInt(last, 10)+"\n" {
			return fmt.Errorf("0/sequence %q, %v; want %d", s, err, last)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false

	// Every sequence 1..last of shard 0 is in the parent's /dispatch or
	// counted in a gap line of shard 0.
	var have, lost int64
	eventually(t, "every line of shard 0 in /dispatch or in a gap line", func() (bool, string) {
		seqs := map[int64]bool{}
		for _, l := range readDispatch(t, p.root, "dispatch") {
			if l.Shard == 0 && l.S != nil {
				seqs[*l.S] = true
			}
		}
		events, _ := dotlRead(p.root, "events")
		lost = 0
		for _, l := range strings.Split(events, "\n") {
			if !strings.Contains(l, " event=gap ") {
				continue
			}
			if !strings.Contains(l, " shard=0 event=gap log=dispatch ") {
				return false, "a gap line of another shard or of no shard: " + l
			}
			n, _ := strconv.ParseInt(logfmtField(l, "lost_lines"), 10, 64)
			lost += n
		}
		have = int64(len(seqs))
		return have+lost == last, fmt.Sprintf("%d lines + %d lost of %d", have, lost, last)
	})
	if lost == 0 {
		t.Fatalf("no line of shard 0 lost (%d of %d in /dispatch): the test wants the transit buffer to overflow", have, last)
	}
	t.Logf("shard 0: %d lines in the parent's /dispatch, %d counted in gap lines, of %d", have, lost, last)

	before0, before1 := sim.Stats(0), sim.Stats(1)
	if err := syscall.Kill(c0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c0 running again", func() (bool, string) {
		c := p.children(t)["c0"]
		return c[0] == "running" && c[1] != strconv.Itoa(c0), strings.Join(c, " ")
	})
	p.waitReady(t, 4)
	after0, after1 := sim.Stats(0), sim.Stats(1)
	if after0.Identifies != before0.Identifies+1 || after0.Resumes != before0.Resumes {
		t.Errorf("shard 0 (a hole in its copy): %d identifies and %d resumes after the crash; want 1 and 0", after0.Identifies-before0.Identifies, after0.Resumes-before0.Resumes)
	}
	if after1.Identifies != before1.Identifies || after1.Resumes != before1.Resumes+1 {
		t.Errorf("shard 1 (no hole): %d identifies and %d resumes after the crash; want 0 and 1", after1.Identifies-before1.Identifies, after1.Resumes-before1.Resumes)
	}
}

// logfmtField is the value of key in a logfmt line.
func logfmtField(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}
