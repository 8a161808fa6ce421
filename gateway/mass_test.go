package gateway

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// TestMassFailure drops all 64 connections at once: every shard must come
// back by resuming, without asking the identify pacer, and each shard's
// recovery must leave the others' state alone.
func TestMassFailure(t *testing.T) {
	for _, f := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(f.String(), func(t *testing.T) {
			const n = 64
			e := newEnv(t, envConfig{flavor: f, shards: n})
			e.start()
			for id := range n {
				e.publish(id, id%3) // shards at different sequences
				e.synced(id)
			}
			requests := e.pacer.requests()
			before := make([]core.Diag, n)
			marks := make([]int64, n)
			for id := range n {
				before[id], marks[id] = e.diag(id), e.mark(id)
			}

			if got := e.sim.Inject(gatewaysim.AllShards, gatewaysim.Fault{Kind: gatewaysim.FaultDrop}); got != n {
				t.Fatalf("Inject(AllShards, drop) reached %d connections; want %d", got, n)
			}
			for id := range n {
				e.waitBackoff(id, marks[id])
			}
			e.simWait("every connection to end", func() bool { return e.sim.Totals().LiveSessions == 0 })
			for id := range n {
				e.publish(id, 2)
			}
			e.clk.Advance(5 * time.Second)
			for id := range n {
				e.waitEvent(id, marks[id], "resumed")
				e.synced(id)
			}

			if got := e.pacer.requests(); got != requests {
				t.Errorf("identify pacer asked %d more times; want 0 (resumes never wait for a slot)", got-requests)
			}
			for id := range n {
				d := e.diag(id)
				if d.State != core.Ready || d.Reconnects != before[id].Reconnects+1 || d.Epoch != before[id].Epoch {
					t.Errorf("shard %d: state %v reconnects %d epoch %d; want READY, %d, %d",
						id, d.State, d.Reconnects, d.Epoch, before[id].Reconnects+1, before[id].Epoch)
				}
				st := e.sim.Stats(id)
				if st.Identifies != 1 || st.Resumes != 1 || st.MaxLiveSessions != 1 {
					t.Errorf("shard %d: simulator saw %d identifies, %d resumes, %d live sessions at most; want 1, 1, 1",
						id, st.Identifies, st.Resumes, st.MaxLiveSessions)
				}
				if sessions, last := e.sink.checkContiguous(t, id); sessions != 1 || last != e.liveSeq(id) {
					t.Errorf("shard %d: sink saw %d sessions ending at %d; want 1 ending at %d", id, sessions, last, e.liveSeq(id))
				}
			}

			// One shard's failure now touches no other shard.
			for id := range n {
				before[id], marks[id] = e.diag(id), e.mark(id)
			}
			e.sim.Inject(7, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4009})
			e.waitBackoff(7, marks[7])
			e.simWait("shard 7's connection to end", func() bool { return e.sim.Stats(7).LiveSessions == 0 })
			e.clk.Advance(5 * time.Second)
			e.waitEvent(7, marks[7], "ready")
			for id := range n {
				if id == 7 {
					continue
				}
				if d := e.diag(id); d.Reconnects != before[id].Reconnects || d.State != core.Ready || e.mark(id) != marks[id] {
					t.Errorf("shard %d changed when shard 7 failed: reconnects %d -> %d, state %v, events grew %d bytes",
						id, before[id].Reconnects, d.Reconnects, d.State, e.mark(id)-marks[id])
				}
			}
		})
	}
}
