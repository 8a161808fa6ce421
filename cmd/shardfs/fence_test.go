package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// A serve paused (SIGSTOP) past its lease delivers nothing, once woken,
// that the gateway sent while it was paused: its reader finds the events
// in the socket at once, before or after its lease timer runs, and the
// fence on reads (core.Fence) drops them. This is the thawed node of issue
// 22 item 1 with a clock that counts the pause (a process stop; a frozen
// VM's clocks do not, doc/fleet.md). The count is logged: the measure.
func TestPausedServeDeliversNothingPastItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses serve for 6 s")
	}
	bin := binDir(t)
	const token = "FENCE-TOKEN-do-not-print"
	sim, err := gatewaysim.New(gatewaysim.Config{Token: token, Shards: 1, MaxConcurrency: 1, HeartbeatInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	n := startNode(t, bin, sim, token, filepath.Join(t.TempDir(), "sessions"))
	n.waitReady(t, 1)
	if err := write(n.root, "ctl", []byte("lease 4s\n")); err != nil {
		t.Fatal(err)
	}
	before := publish(t, sim, 1, 3, "before")
	waitIDs(t, n.root, before)
	if err := write(n.root, "ctl", []byte("lease 4s\n")); err != nil { // renewed: 4 s from now
		t.Fatal(err)
	}
	pid := n.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "serve stopped", func() (bool, string) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return err == nil && i > 0 && strings.HasPrefix(s[i+1:], " T"), s
	})
	// The pause itself, past the 4 s lease: a fault, not a wait for a state.
	time.Sleep(6 * time.Second)
	during := publish(t, sim, 1, 20, "during")
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, "shard 0 STOPPED after its lease", func() (bool, string) {
		s, err := dotlRead(n.root, "0/state")
		return err == nil && strings.TrimSpace(s) == "STOPPED", s
	})
	got := messageIDs(readDispatch(t, n.root, "0/dispatch"))
	delivered := 0
	for _, id := range during {
		delivered += got[id]
	}
	t.Logf("events the gateway sent during the pause delivered after SIGCONT: %d of %d", delivered, len(during))
	if delivered != 0 {
		t.Fatalf("a serve woken past its lease delivered %d of the %d events sent while it was paused; want 0", delivered, len(during))
	}
	for _, id := range before {
		if got[id] != 1 {
			t.Fatalf("event %s before the pause delivered %d times; want 1", id, got[id])
		}
	}
}
