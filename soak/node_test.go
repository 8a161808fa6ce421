package soak

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// A Node runs the real serve (without etcd here), reads its tree, gives up
// on a read within opTimeout while the process is stopped and reads again
// after SIGCONT; the frames its shards send are put down to it through
// /proc.
func TestNodeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs serve")
	}
	bin := buildServe(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &Process{Name: "solo", bin: bin, env: []string{"SHARDFS_TOKEN=" + token},
		args: []string{"serve", "--flavor", "discord", "--api", "http://" + ln.Addr().String() + "/api/v10", "--total", "2", "--max-concurrency", "2", "--listen", "tcp!127.0.0.1!0"}}
	frames := newFrameLog(portOf(ln.Addr().String()), func() map[int]string { return map[int]string{n.Pid(): n.Name} })
	sim, err := gatewaysim.New(gatewaysim.Config{Listener: ln, Token: token, Shards: 2, MaxConcurrency: 2, HeartbeatInterval: time.Second, OnFrame: func(f gatewaysim.Frame) { frames.add(f) }})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(syscall.SIGKILL, 10*time.Second)
	readyBoth := func() error {
		text, err := n.Read("status")
		if err != nil {
			return err
		}
		if st, err := parseStatus(text); err != nil || st[0] != "READY" || st[1] != "READY" {
			return fmt.Errorf("status %q", text)
		}
		return nil
	}
	waitFor(t, "both shards READY", readyBoth)

	if err := n.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The signal is delivered asynchronously: a read sent before the
	// process stopped is answered.
	waitStopped(t, n.Pid())
	began := time.Now()
	if _, err := n.Read("status"); err == nil {
		t.Fatal("a stopped serve answered")
	}
	if d := time.Since(began); d > opTimeout+2*time.Second {
		t.Errorf("the read of a stopped serve gave up after %v; want about %v", d, opTimeout)
	}
	if err := n.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "serve answering after SIGCONT", readyBoth)
	if err := n.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	all := frames.all()
	seen := map[string]bool{}
	for _, f := range all {
		if f.node != "solo" {
			t.Errorf("frame %v not put down to serve", f)
		}
		if f.op == 2 {
			seen["identify "+strconv.Itoa(f.shard)] = true
		}
		if f.op == gatewaysim.OpClose && f.code == 4000 {
			seen["close "+strconv.Itoa(f.shard)] = true
		}
	}
	for _, want := range []string{"identify 0", "identify 1", "close 0", "close 1"} {
		if !seen[want] {
			t.Errorf("no %s among the %d frames", want, len(all))
		}
	}
	if strings.Contains(n.Log(), token) {
		t.Error("serve's log holds the token")
	}
}

// waitFor polls cond at a process boundary until it holds, for at most
// ReadyTimeout.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	if err := poll.Until(context.Background(), what, ReadyTimeout, 100*time.Millisecond, cond); err != nil {
		t.Fatal(err)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/PID/task/TID/stat): the stop of a group is delivered to each
// thread asynchronously, and one running thread could still answer.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	err := poll.Until(context.Background(), fmt.Sprintf("process %d stopped", pid), ReadyTimeout, 10*time.Millisecond, func() error {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return poll.Stop(fmt.Errorf("no threads of process %d: %v", pid, err))
		}
		for _, stat := range tasks {
			st, err := procState(stat)
			if err != nil {
				return err // the thread ended between Glob and read
			}
			if st != "T" {
				return fmt.Errorf("%s: state %s", stat, st)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// procState reads the scheduler state (R, S, D, T, ...) from a stat file of
// /proc.
func procState(stat string) (string, error) {
	b, err := os.ReadFile(stat)
	if err != nil {
		return "", err
	}
	// The command name in parentheses may hold spaces and parentheses;
	// the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+3 >= len(s) {
		return "", fmt.Errorf("%s: %q", stat, s)
	}
	return s[i+2 : i+3], nil
}
