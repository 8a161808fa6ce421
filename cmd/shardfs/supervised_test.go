package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/reshard"
	"github.com/shardfs/shardfs/supervisor"
)

// A supervised child that runs the whole plan (supervise --processes 1)
// refuses `reshard` as its parent does, as the write's error, and says so
// without pointing at a /ctl that would refuse too.
func TestSupervisedChildRefusesMoves(t *testing.T) {
	n, err := node.New(node.Config{Flavor: core.Discord, Token: "sim-token", GatewayURL: "ws://127.0.0.1:1", Plan: core.Range(2, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	(&childLink{}).refuseMoves(n)
	var nilLink *childLink
	nilLink.refuseMoves(n) // serve without supervise: nothing to do
	ctl := n.Tree.Root().Lookup("ctl").(*fsrv.Ctl)
	err = ctl.Handle("reshard 4")
	if !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "supervise does not move to a larger plan yet") || strings.Contains(err.Error(), "/ctl") {
		t.Fatalf("reshard 4 = %v; want it refused as it is written, naming supervise and pointing at no /ctl", err)
	}
	events := n.Scheduler.Events()
	buf := make([]byte, 1<<16)
	k, _ := events.ReadAt(buf, events.Oldest())
	if line := buf[:k]; !bytes.Contains(line, []byte("event=rejected")) || !bytes.Contains(line, []byte("supervise does not move to a larger plan yet")) {
		t.Fatalf("no rejected line naming supervise:\n%s", line)
	}
	if c, _ := n.Current(); c != n.Scheduler {
		t.Fatal("the child moved to another plan")
	}
}

// A supervised child that gets SIGHUP (its process group orphaned by the
// parent's death while it was stopped) shuts down as when the channel
// ends, to save its sessions, instead of dying at once (Go's default for
// SIGHUP): without the handler this test's process would die.
func TestSupervisedChildSavesOnHangup(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent := os.NewFile(uintptr(fds[0]), "parent")
	defer parent.Close()
	ctx, c := linkChild(context.Background(), supervisor.NewLink(os.NewFile(uintptr(fds[1]), "child")))
	defer c.Close()
	if err := unix.Kill(os.Getpid(), unix.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the child's context did not end within a minute of SIGHUP")
	}
}
