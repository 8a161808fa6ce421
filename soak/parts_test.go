package soak

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	MaybeRunEtcd()
	goleak.VerifyTestMain(m)
}

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, line string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echo " + got)
	}
	return nil
}

// A cut drops the live connection and refuses new ones; a heal accepts
// again on the same port.
func TestProxyCutHeal(t *testing.T) {
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, "before"); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut()
	if err := roundTrip(c, r, "during"); err == nil {
		t.Fatal("a connection made before the cut still works after it")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		c2.Close()
		t.Fatal("a new connection was accepted while cut")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while cut: %v; want connection refused", err)
	}
	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial after heal: %v", err)
	}
	defer c3.Close()
	if err := roundTrip(c3, bufio.NewReader(c3), "after"); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

// socketOwner finds this process as the owner of a connection it made,
// and none among other processes.
func TestSocketOwner(t *testing.T) {
	addr := echoServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port, peer := portOf(c.LocalAddr().String()), portOf(addr)
	me := os.Getpid()
	if pid, err := socketOwner(port, peer, []int{1, me}); err != nil || pid != me {
		t.Fatalf("socketOwner(%d, %d) = %d, %v; want %d", port, peer, pid, err, me)
	}
	if pid, err := socketOwner(port, peer, []int{1}); err == nil {
		t.Fatalf("socketOwner among pid 1 only = %d; want an error", pid)
	}
	if _, err := socketOwner(port, peer+1, []int{me}); err == nil {
		t.Fatal("socketOwner with the wrong peer port found a socket")
	}
}

// The etcd child keeps its data across kill -9, answers nothing while
// stopped, and answers again after SIGCONT.
func TestEtcdChild(t *testing.T) {
	ctx := context.Background()
	e, cli := StartEtcd(t)
	bounded := func(d time.Duration) (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) }
	c1, cancel := bounded(10 * time.Second)
	defer cancel()
	if _, err := cli.Put(c1, "k", "v"); err != nil {
		t.Fatal(err)
	}
	e.Kill()
	if e.Running() {
		t.Fatal("running after Kill")
	}
	if err := e.Start(ctx); err != nil {
		t.Fatalf("restart on the same data: %v", err)
	}
	c2, cancel := bounded(10 * time.Second)
	defer cancel()
	if r, err := cli.Get(c2, "k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("after the restart: %v, %v; want k=v", r, err)
	}
	if err := e.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c3, cancel := bounded(time.Second)
	defer cancel()
	if _, err := cli.Get(c3, "k"); err == nil {
		t.Fatal("a stopped etcd answered")
	}
	if err := e.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c4, cancel := bounded(10 * time.Second)
	defer cancel()
	if _, err := cli.Get(c4, "k"); err != nil {
		t.Fatalf("after SIGCONT: %v", err)
	}
}

// ownedIn decides a frame's legitimacy from the watch's history.
func TestOwnedIn(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	h := []ownerChange{{at(0), "a"}, {at(10), ""}, {at(12), "b"}, {at(20), ""}, {at(21), "a"}}
	for _, tc := range []struct {
		node     string
		from, to float64
		want     bool
	}{
		{"a", 5, 6, true},      // owned throughout
		{"a", 11, 11.5, false}, // nobody owned it
		{"b", 11, 11.5, false},
		{"b", 11.5, 12.5, true}, // acquired within the slack
		{"a", 13, 14, false},    // b owned it
		{"b", 20.5, 20.7, false},
		{"a", 25, 26, true},
		{"c", 0, 30, false},
		{"a", -2, -1, false}, // before any key
	} {
		if got := ownedIn(h, tc.node, at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("ownedIn(%s, %v..%v) = %v; want %v", tc.node, tc.from, tc.to, got, tc.want)
		}
	}
}

func TestParseStatus(t *testing.T) {
	st, err := parseStatus("0 READY 12 0 3\n3 STOPPED none 2 0\n")
	if err != nil || len(st) != 2 || st[0] != "READY" || st[3] != "STOPPED" {
		t.Fatalf("parseStatus = %v, %v", st, err)
	}
	for _, bad := range []string{"0 READY 1 0\n", "x READY 1 0 0\n", "1 READY 1 0 0\n1 READY 1 0 0\n"} {
		if _, err := parseStatus(bad); err == nil {
			t.Errorf("parseStatus(%q) accepted", bad)
		}
	}
	if got := memberNames("node2 5\nnode1 6\n"); len(got) != 2 || got[0] != "node1" || got[1] != "node2" {
		t.Errorf("memberNames = %v", got)
	}
}

// A close frame may arrive up to ownSlack after the watch saw its sender
// lose the shard; any other frame may not.
func TestOwnedCloseSlack(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	o := &owners{hist: map[int][]ownerChange{3: {{t0, "a"}, {t0.Add(10 * time.Second), ""}}}}
	c := &cluster{owners: o}
	late := t0.Add(10*time.Second + 300*time.Millisecond)
	for _, tc := range []struct {
		f    sentFrame
		want bool
	}{
		{sentFrame{node: "a", shard: 3, op: gatewaysim.OpClose, code: 4000, at: late}, true},
		{sentFrame{node: "a", shard: 3, op: 1, at: late}, false},
		{sentFrame{node: "a", shard: 3, op: gatewaysim.OpClose, code: 4000, at: late.Add(2 * time.Second)}, false},
		{sentFrame{node: "b", shard: 3, op: gatewaysim.OpClose, code: 4000, at: late}, false},
		{sentFrame{node: "b", shard: 3, op: gatewaysim.OpClose, reply: true, at: late}, true},
	} {
		if got := c.owned(tc.f); got != tc.want {
			t.Errorf("owned(%v) = %v; want %v", tc.f, got, tc.want)
		}
	}
}
