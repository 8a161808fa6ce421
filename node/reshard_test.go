package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// readLog returns what a journal holds, from its oldest line.
func readLog(src interface {
	ReadAt(p []byte, off int64) (int, int64)
	Size() int64
	Oldest() int64
}) []byte {
	var out []byte
	buf := make([]byte, 64<<10)
	for off := src.Oldest(); off < src.Size(); {
		n, start := src.ReadAt(buf, off)
		if n == 0 {
			break
		}
		out = append(out, buf[:n]...)
		off = start + int64(n)
	}
	return out
}

// waitEvent waits until the node's events log holds a line with want.
func waitEvent(t *testing.T, s *Node, want string, bound time.Duration) {
	t.Helper()
	timeout := time.After(bound)
	for {
		notify := s.events.Notify()
		if bytes.Contains(readLog(s.events), []byte(want)) {
			return
		}
		select {
		case <-notify:
		case <-timeout:
			t.Fatalf("no %q in the events within %v:\n%s", want, bound, readLog(s.events))
		}
	}
}

// TestReshardOn4011: one shard of a plan with traffic flowing closes
// 4011; the node starts the larger plan beside the old one, switches once
// every new shard is READY, and every message the simulator sequenced
// into a session of either plan appears once in /dispatch. The old
// sessions end with 1000 after the switch.
func TestReshardOn4011(t *testing.T) {
	for _, tc := range []struct {
		flavor             core.Flavor
		sim                gatewaysim.Flavor
		oldTotal, newTotal int
		guilds             int
		fatal              int
	}{
		// Discord: discovery recommends 8 once the bot has grown.
		{core.Discord, gatewaysim.Discord, 4, 8, 40, 1},
		// Fluxer: 4,400 communities make ceil(4400/2000) = 3 shards.
		{core.Fluxer, gatewaysim.Fluxer, 2, 3, 4400, 1},
	} {
		t.Run(tc.flavor.String(), func(t *testing.T) {
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: tc.sim, Shards: tc.oldTotal, MaxConcurrency: 8, Guilds: tc.guilds, HeartbeatInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			s, err := New(Config{Flavor: tc.flavor, Token: "sim-token", API: sim.APIURL(), GatewayURL: sim.GatewayURL(),
				Plan: core.Range(tc.oldTotal, 0, tc.oldTotal-1), MaxConcurrency: 8, Intents: 1<<0 | 1<<9, Reshard: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.Start()
			if err := waitReady(s, 30*time.Second); err != nil {
				t.Fatal(err)
			}

			// Traffic on every guild, each message with its own id.
			var mu sync.Mutex
			sent := map[string]int{} // id -> sessions it was sequenced into
			var limit atomic.Int64
			limit.Store(1 << 62)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; int64(i) < limit.Load(); i++ {
					id := fmt.Sprint(i)
					n, err := sim.PublishGuild(gatewaysim.GuildID(1+i%tc.guilds), gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"` + id + `"}`)})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					sent[id] = n
					mu.Unlock()
					if i%10 == 9 {
						time.Sleep(time.Millisecond) // a steady flow, not a flood
					}
				}
			}()

			sim.SetShards(tc.newTotal)
			if n := sim.Inject(tc.fatal, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."}); n != 1 {
				t.Fatalf("Inject(4011) reached %d connections; want 1", n)
			}
			waitEvent(t, s, "event=reshard-start", 30*time.Second)
			waitEvent(t, s, "event=reshard-switch", 60*time.Second)
			c, _ := s.Current()
			if got := c.Plan().Total; got != tc.newTotal {
				t.Fatalf("after the switch the plan has %d shards; want %d", got, tc.newTotal)
			}
			// 200 more messages on the new plan, then let them arrive.
			mu.Lock()
			limit.Store(int64(len(sent) + 200))
			mu.Unlock()
			wg.Wait()

			mu.Lock()
			defer mu.Unlock()
			want := 0
			for _, n := range sent {
				if n > 0 {
					want++
				}
			}
			// Wait until every sequenced message is in /dispatch.
			_, tree := s.Current()
			log := tree.NodeDispatchLog()
			timeout := time.After(30 * time.Second)
			var got map[string]int
			for {
				notify := log.Notify()
				got = map[string]int{}
				for _, line := range bytes.Split(readLog(log), []byte{'\n'}) {
					var v struct {
						T string
						D struct{ ID string }
					}
					if json.Unmarshal(line, &v) == nil && v.T == "MESSAGE_CREATE" {
						got[v.D.ID]++
					}
				}
				if len(got) >= want {
					break
				}
				select {
				case <-notify:
				case <-timeout:
					missing := 0
					for id, n := range sent {
						if n > 0 && got[id] == 0 && missing < 20 {
							missing++
							var i int
							fmt.Sscan(id, &i)
							g := gatewaysim.GuildID(1 + i%tc.guilds)
							t.Logf("missing %s: %d sessions, old shard %d, new shard %d", id, n, core.ShardOf(g, tc.oldTotal), core.ShardOf(g, tc.newTotal))
						}
					}
					cc, _ := s.Current()
					for _, d := range cc.Snapshot(nil) {
						t.Logf("node shard %d: %v seq %d reconnects %d", d.Shard, d.State, d.Sequence, d.Reconnects)
					}
					for k := range tc.newTotal {
						for _, si := range sim.Sessions(k) {
							t.Logf("sim shard %d: %+v", k, si)
						}
					}
					t.Fatalf("/dispatch holds %d of the %d messages sequenced into a session", len(got), want)
				}
			}
			for id, n := range sent {
				switch {
				case n > 0 && got[id] != 1:
					t.Errorf("message %s reached %d sessions and appears %d times in /dispatch; want once", id, n, got[id])
				case n == 0 && got[id] != 0:
					t.Errorf("message %s reached no session and appears %d times", id, got[id])
				}
			}
			// The old plan's sessions ended with 1000 (the simulator
			// drops a session at once then), after the switch.
			for k := range tc.oldTotal {
				for _, si := range sim.Sessions(k) {
					if si.Total == tc.oldTotal && k != tc.fatal {
						t.Errorf("shard %d of %d still has a session: %+v; want it ended with 1000", k, tc.oldTotal, si)
					}
				}
			}
			events := string(readLog(s.events))
			sw, end := strings.Index(events, "event=reshard-switch"), strings.Index(events, "event=plan-replaced")
			if end < 0 || end < sw {
				t.Errorf("the old shards' plan-replaced lines (at %d) do not follow the switch (at %d):\n%s", end, sw, events)
			}
			// The overlap was exercised: the new plan brought copies of
			// what the old one delivered, and they were recognised.
			var dropped int
			if i := strings.Index(events, "copies_dropped="); i >= 0 {
				fmt.Sscan(events[i+len("copies_dropped="):], &dropped)
			}
			if dropped == 0 {
				t.Errorf("the switch dropped no copies: the two plans never overlapped, so the test proved nothing about the cut:\n%s", events)
			}
			t.Logf("simulator totals: %+v", sim.Totals())
			if tot := sim.Totals(); tot.MaxLiveSessions > 2 {
				t.Errorf("simulator: at most %d live sessions a shard id; want 2 at most (one per plan)", tot.MaxLiveSessions)
			}
		})
	}
}
