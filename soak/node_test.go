package soak

import (
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
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
	readyBoth := func() (bool, string) {
		text, err := n.Read("status")
		if err != nil {
			return false, err.Error()
		}
		st, err := parseStatus(text)
		return err == nil && st[0] == "READY" && st[1] == "READY", text
	}
	poll(t, "both shards READY", readyBoth)

	if err := n.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
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
	poll(t, "serve answering after SIGCONT", readyBoth)
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

// poll checks f at a process boundary until it holds, for at most
// ReadyTimeout.
func poll(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(ReadyTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var ok bool
		if ok, last = f(); ok {
			return
		}
	}
	t.Fatalf("%s: never; last %q", what, last)
}
