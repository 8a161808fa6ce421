package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/node"
)

// A supervised child that runs the whole plan (supervise --processes 1)
// refuses `reshard` as its parent does, and says so without pointing at a
// /ctl that would refuse too.
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
	if err := ctl.Handle("reshard 4"); err != nil {
		t.Fatalf("reshard 4 = %v; want it taken, refused in the background", err)
	}
	events := n.Scheduler.Events()
	timeout := time.After(10 * time.Second)
	for {
		notify := events.Notify()
		buf := make([]byte, 1<<16)
		k, _ := events.ReadAt(buf, events.Oldest())
		if line := buf[:k]; bytes.Contains(line, []byte("event=reshard-refused")) {
			if !strings.Contains(string(line), "supervise does not move to a larger plan yet") || strings.Contains(string(line), "/ctl") {
				t.Fatalf("the refusal does not name supervise, or points at /ctl:\n%s", line)
			}
			break
		}
		select {
		case <-notify:
		case <-timeout:
			t.Fatal("no reshard-refused line within 10s")
		}
	}
	if c, _ := n.Current(); c != n.Scheduler {
		t.Fatal("the child moved to another plan")
	}
}
