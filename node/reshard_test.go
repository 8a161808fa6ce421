package node

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/reshard"
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
// into a session of either plan appears once in /dispatch, in the order
// it was sent within its guild. The simulator sees each old session end
// with a 1000 from the client after the switch, and no identify refused.
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
			// The client's close frames of the old plan's sessions, as
			// the simulator received them.
			var closeMu sync.Mutex
			var closes []gatewaysim.Frame
			onFrame := func(f gatewaysim.Frame) {
				if f.Op == gatewaysim.OpClose && f.Total == tc.oldTotal {
					closeMu.Lock()
					closes = append(closes, f)
					closeMu.Unlock()
				}
			}
			// Heartbeats tell the simulator how far the node has read
			// each session (see overlap below): one every 2 s, which a
			// loaded machine does not miss, and never a 4009.
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: tc.sim, Shards: tc.oldTotal, MaxConcurrency: 8, Guilds: tc.guilds,
				HeartbeatInterval: 2 * time.Second, HeartbeatTimeout: 2 * time.Hour, OnFrame: onFrame})
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
			if tc.flavor == core.Discord {
				discover(t, s)
			}
			s.Start()
			if err := waitReady(s, 30*time.Second); err != nil {
				t.Fatal(err)
			}

			// Traffic on every guild, each message with its own id.
			var mu sync.Mutex
			sent := map[string]int{}           // id -> sessions it was sequenced into
			var published atomic.Int64         // how many messages the simulator has sequenced
			progress := make(chan struct{}, 1) // a message was published
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
					published.Store(int64(i + 1))
					select {
					case progress <- struct{}{}:
					default:
					}
					if i%10 == 9 {
						time.Sleep(time.Millisecond) // a steady flow, not a flood
					}
				}
			}()
			// A test that fails early stops the publisher before the
			// simulator closes.
			defer func() {
				limit.Store(0)
				wg.Wait()
			}()

			// The switch waits for the test, so that the plans overlap
			// by construction, not by the timing of a loaded machine.
			gate := make(chan struct{})
			release := sync.OnceFunc(func() { close(gate) })
			defer release()
			s.move.HoldSwitch(gate)
			sim.SetShards(tc.newTotal)
			injectLive(t, sim, tc.fatal, tc.oldTotal, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."})
			waitEvent(t, s, "event=reshard-start", 30*time.Second)
			waitNewReady(t, s, tc.newTotal, 60*time.Second)
			overlap(t, sim, &mu, sent, &published, progress, tc.oldTotal, tc.newTotal)
			release()
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
			got := waitMessages(t, s, sent, 30*time.Second)
			checkOnce(t, sent, got)
			// A guild whose old shard kept serving had a session at every
			// moment: an old session closed before the switch would leave
			// its messages in the gap sequenced into none.
			for id, n := range sent {
				var i int
				fmt.Sscan(id, &i)
				if g := gatewaysim.GuildID(1 + i%tc.guilds); n == 0 && reshard.ShardOf(g, tc.oldTotal) != tc.fatal {
					t.Errorf("message %s of guild %d (old shard %d, serving) reached no session", id, g, reshard.ShardOf(g, tc.oldTotal))
				}
			}
			// Per guild, /dispatch has the messages in the order they
			// were sent.
			_, tree := s.Current()
			last := map[int]int{}
			for _, id := range dispatchIDs(tree.NodeDispatchLog()) {
				var i int
				fmt.Sscan(id, &i)
				g := i % tc.guilds
				if p, ok := last[g]; ok && i < p {
					t.Errorf("guild %d: message %d comes after message %d in /dispatch", g, i, p)
				}
				last[g] = i
			}

			// At the simulator: every old session but the 4011 one ended
			// with a 1000 from the client, after the switch.
			events := string(readLog(s.events))
			switchAt := lineTime(t, events, "event=reshard-switch")
			closeMu.Lock()
			ended := map[int]int{}
			for _, f := range closes {
				if f.Shard == tc.fatal {
					continue
				}
				ended[f.Shard]++
				if f.Code != 1000 || f.Reply || f.At.Before(switchAt) {
					t.Errorf("old shard %d closed with %d (reply %v) at %v; want a 1000 from the client at or after the switch at %v",
						f.Shard, f.Code, f.Reply, f.At.UTC().Format(time.StampMilli), switchAt.Format(time.StampMilli))
				}
			}
			closeMu.Unlock()
			for k := range tc.oldTotal {
				if k != tc.fatal && ended[k] != 1 {
					t.Errorf("old shard %d: the simulator saw %d closes from the client; want one", k, ended[k])
				}
				for _, si := range sim.Sessions(k) {
					if si.Total == tc.oldTotal && k != tc.fatal {
						t.Errorf("shard %d of %d still has a session: %+v; want it ended with 1000", k, tc.oldTotal, si)
					}
				}
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
			tot := sim.Totals()
			t.Logf("simulator totals: %+v", tot)
			if tot.MaxLiveSessions > 2 {
				t.Errorf("simulator: at most %d live sessions a shard id; want 2 at most (one per plan)", tot.MaxLiveSessions)
			}
			if tot.RefusedIdentifies != 0 {
				t.Errorf("simulator: %d identifies refused; want none (the new plan's identifies are paced with the old plan's)", tot.RefusedIdentifies)
			}
		})
	}
}

// overlap makes sure that both plans of a move held at its switch bring
// the Cut copies of one event: it waits until the publisher has sent 100
// more messages (every new shard is READY, so those of the guilds of the
// old plan's serving shards reach a session of each plan), then until the
// node has read every live session of both plans that far (their
// heartbeats say so).
func overlap(t *testing.T, sim *gatewaysim.Server, mu *sync.Mutex, sent map[string]int, published *atomic.Int64, progress <-chan struct{}, oldTotal, newTotal int) {
	t.Helper()
	from := published.Load()
	timeout := time.After(30 * time.Second)
	for published.Load() < from+100 {
		select {
		case <-progress:
		case <-timeout:
			t.Fatalf("the publisher sent %d messages in 30 s; want 100", published.Load()-from)
		}
	}
	mu.Lock()
	both := 0
	for i := from; i < from+100; i++ {
		if sent[fmt.Sprint(i)] == 2 {
			both++
		}
	}
	mu.Unlock()
	if both == 0 {
		t.Fatal("no message reached both plans while both were live; the test proves nothing about the cut")
	}
	// The sequence each live session had reached once those were sent.
	type session struct{ shard, total int }
	reached := map[session]int64{}
	for k := range newTotal {
		for _, si := range sim.Sessions(k) {
			if si.Live && (si.Total == oldTotal || si.Total == newTotal) {
				reached[session{k, si.Total}] = si.Seq
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := sim.Wait(ctx, func() bool {
		for k := range newTotal {
			for _, si := range sim.Sessions(k) {
				if seq, ok := reached[session{k, si.Total}]; ok && si.Acked < seq {
					return false
				}
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the node did not read both plans' sessions as far as the overlap: %v", err)
	}
}

// lineTime is the ts of the first events line holding want.
func lineTime(t *testing.T, events, want string) time.Time {
	t.Helper()
	i := strings.Index(events, want)
	if i < 0 {
		t.Fatalf("no %q in the events", want)
	}
	line := events[strings.LastIndex(events[:i], "\n")+1 : i]
	ts, ok := strings.CutPrefix(strings.Fields(line)[0], "ts=")
	at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", ts)
	if !ok || err != nil {
		t.Fatalf("line %q: no ts: %v", line, err)
	}
	return at
}
