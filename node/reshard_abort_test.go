package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/reshard"
)

// waitNewReady waits until the move's new plan has every one of its total
// shards READY.
func waitNewReady(t *testing.T, s *Node, total int, bound time.Duration) {
	t.Helper()
	timeout := time.After(bound)
	for {
		notify := s.events.Notify()
		if st := s.move.Status(); st.State == reshard.Starting && st.Ready == total {
			return
		}
		select {
		case <-notify:
		case <-timeout:
			t.Fatalf("the new plan's %d shards were not all READY within %v:\n%s", total, bound, readLog(s.events))
		}
	}
}

// injectLive applies f to shard's connection in the plan of total shards
// once that shard has a live session and no other (a shard that is
// reconnecting has no connection for the fault to reach), and fails
// unless it reached exactly one connection.
func injectLive(t *testing.T, sim *gatewaysim.Server, shard, total int, f gatewaysim.Fault) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := sim.Wait(ctx, func() bool {
		ss := sim.Sessions(shard)
		return len(ss) > 0 && !slices.ContainsFunc(ss, func(si gatewaysim.SessionInfo) bool { return !si.Live || si.Total != total })
	})
	if err != nil {
		t.Fatalf("shard %d of %d has no live session alone: %v (%+v)", shard, total, err, sim.Sessions(shard))
	}
	if n := sim.Inject(shard, f); n != 1 {
		t.Fatalf("Inject(%d, %v) on shard %d of %d reached %d connections; want 1", shard, f.Code, shard, total, n)
	}
}

// dispatchIDs returns the ids of the MESSAGE_CREATEs in a dispatch log, in
// its order.
func dispatchIDs(log *journal.Merged) []string {
	var ids []string
	for _, line := range bytes.Split(readLog(log), []byte{'\n'}) {
		var v struct {
			T string
			D struct{ ID string }
		}
		if json.Unmarshal(line, &v) == nil && v.T == "MESSAGE_CREATE" {
			ids = append(ids, v.D.ID)
		}
	}
	return ids
}

// waitMessages waits until the node's /dispatch holds every id of sent
// that reached a session (sent[id] > 0), and returns how often each id
// appears.
func waitMessages(t *testing.T, s *Node, sent map[string]int, bound time.Duration) map[string]int {
	t.Helper()
	want := 0
	for _, n := range sent {
		if n > 0 {
			want++
		}
	}
	_, tree := s.Current()
	log := tree.NodeDispatchLog()
	timeout := time.After(bound)
	for {
		notify := log.Notify()
		got := map[string]int{}
		for _, id := range dispatchIDs(log) {
			got[id]++
		}
		if len(got) >= want {
			return got
		}
		select {
		case <-notify:
		case <-timeout:
			missing := 0
			for id, n := range sent {
				if n > 0 && got[id] == 0 {
					missing++
				}
			}
			t.Fatalf("/dispatch holds %d of the %d messages sequenced into a session (%d missing)\n%s", len(got), want, missing, readLog(s.events))
			return nil
		}
	}
}

// checkOnce fails for every id of sent that reached a session and does not
// appear exactly once in got, or that reached none and appears.
func checkOnce(t *testing.T, sent, got map[string]int) {
	t.Helper()
	for id, n := range sent {
		switch {
		case n > 0 && got[id] != 1:
			t.Errorf("message %s reached %d sessions and appears %d times in /dispatch; want once", id, n, got[id])
		case n == 0 && got[id] != 0:
			t.Errorf("message %s reached no session and appears %d times", id, got[id])
		}
	}
}

// A new shard going FATAL while the move waits to switch aborts the move,
// and the switch does not run afterwards: the node stays on the old plan,
// which keeps serving (before the fix it switched to the dead plan).
func TestReshardAbortDuringSwitchWait(t *testing.T) {
	s, sim := startSmall(t, core.Discord, 4, 40, Config{})
	gate := make(chan struct{})
	s.move.HoldSwitch(gate)
	if _, err := s.move.Command("reshard 8"); err != nil {
		t.Fatal(err)
	}
	waitNewReady(t, s, 8, 60*time.Second)
	// Every new shard is READY: the move waits for the switch. Shard 5
	// exists only in the new plan.
	if n := sim.Inject(5, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."}); n != 1 {
		t.Fatalf("Inject(5, 4011) reached %d connections; want 1", n)
	}
	waitEvent(t, s, "event=reshard-aborted", 30*time.Second)
	close(gate) // the wait ends: a move still running would switch now
	s.move.Wait()
	if c, _ := s.Current(); c != s.Scheduler {
		t.Fatalf("the node switched to the aborted plan of %d shards", c.Plan().Total)
	}
	events := string(readLog(s.events))
	if strings.Contains(events, "event=reshard-switch") {
		t.Errorf("a switch after the abort:\n%s", events)
	}
	if got := string(s.move.File()); !strings.Contains(got, "state aborted\n") {
		t.Errorf("/reshard = %q; want state aborted", got)
	}
	for _, d := range s.Scheduler.Snapshot(nil) {
		if d.State != core.Ready {
			t.Errorf("old shard %d is %v; want READY", d.Shard, d.State)
		}
	}
}

// An abort loses no event: what the new plan alone received (the guilds
// of the old plan's 4011 shard, which no old session serves) was held for
// the switch, and comes out at the abort; what both plans received comes
// out once.
func TestReshardAbortKeepsEvents(t *testing.T) {
	const guilds = 40
	// Heartbeats tell the simulator how far the node has read each
	// session. One a second is few enough that a loaded machine does not
	// miss one (the client calls a connection whose ACK takes an interval
	// a zombie; at 100 ms that happened, and 4008s for sending too
	// often), and a reconnect that happens anyway waits a fixed short
	// time, not a backoff grown past the test's bounds.
	s, sim := startSmallBeating(t, core.Discord, 4, guilds, Config{Reshard: true, Backoff: core.Fixed(100 * time.Millisecond)}, time.Second)
	gate := make(chan struct{})
	defer close(gate)
	s.move.HoldSwitch(gate)
	sim.SetShards(8)
	injectLive(t, sim, 1, 4, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."})
	waitEvent(t, s, "event=reshard-start", 30*time.Second)
	waitNewReady(t, s, 8, 60*time.Second)

	// Every guild gets messages: those of old shard 1 reach only the new
	// plan's shards 1 and 5.
	sent := map[string]int{}
	deadOnly := 0
	for i := range 5 * guilds {
		id := fmt.Sprint(i)
		g := gatewaysim.GuildID(1 + i%guilds)
		n, err := sim.PublishGuild(g, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"` + id + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		sent[id] = n
		if reshard.ShardOf(g, 4) == 1 && n > 0 {
			deadOnly++
		}
	}
	if deadOnly == 0 {
		t.Fatal("no message reached only the new plan; the test proves nothing")
	}
	// The node has read every message of the new plan's shards 1 and 5
	// (their heartbeats say so): a connection that closes drops what its
	// reader has not taken yet, and a message lost that way reached no
	// reader at all...
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := sim.Wait(ctx, func() bool {
		for _, k := range []int{1, 5} {
			for _, si := range sim.Sessions(k) {
				if si.Total == 8 && si.Acked != si.Seq {
					return false
				}
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the node did not read the messages: %v", err)
	}
	// ... and the new plan's shard 1 closes 4011 after them (one
	// connection delivers in order): they were held when the move aborts.
	injectLive(t, sim, 1, 8, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."})
	waitEvent(t, s, "event=reshard-aborted", 30*time.Second)
	got := waitMessages(t, s, sent, 30*time.Second)
	checkOnce(t, sent, got)
	if c, _ := s.Current(); c != s.Scheduler {
		t.Fatal("the node switched plans after an abort")
	}
	// The aborted sessions' READY is not delivered.
	for _, line := range bytes.Split(readLog(s.Tree.NodeDispatchLog()), []byte{'\n'}) {
		if bytes.Contains(line, []byte(`"t":"READY"`)) && bytes.Contains(line, []byte(`"shard":5`)) {
			t.Errorf("the aborted plan's READY is in /dispatch: %s", line)
		}
	}
}

// A 4011 of the old plan during a move writes its own line: the move under
// way covers the shard's guilds; the move goes on.
func TestReshardOld4011DuringMove(t *testing.T) {
	s, _ := startSmall(t, core.Discord, 4, 40, Config{Reshard: true})
	gate := make(chan struct{})
	defer close(gate)
	s.move.HoldSwitch(gate)
	if _, err := s.move.Command("reshard 8"); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, s, "event=reshard-start", 30*time.Second)
	// What the old plan's core calls when its shard 2 goes FATAL on a
	// 4011 (shard 2 is in both plans, so the simulator cannot close
	// only the old plan's connection).
	s.move.OnFatal(s.current())(2, 4011)
	waitEvent(t, s, "event=reshard-running shard=2 plan=old old_total=4 new_total=8", 10*time.Second)
	if got := string(s.move.File()); !strings.Contains(got, "state starting\n") {
		t.Errorf("/reshard = %q; want the move still starting", got)
	}
}
