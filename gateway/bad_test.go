package gateway

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// TestBadInput feeds one shard of three every kind of bad input in turn.
// Each must end in a classified failure (or, where the platform says so,
// be ignored), never a panic; the shard must recover; the other two shards
// must not notice.
func TestBadInput(t *testing.T) {
	inputs := []struct {
		name  string
		fault gatewaysim.Fault
		// reason is part of the error the backoff line must carry; empty
		// means the input is ignored.
		reason, fluxerReason string
	}{
		{"garbage", gatewaysim.Fault{Kind: gatewaysim.FaultGarbage}, "", ""},
		{"invalid-json", gatewaysim.Fault{Kind: gatewaysim.FaultInvalidJSON}, "", ""},
		{"second-hello", gatewaysim.Fault{Kind: gatewaysim.FaultSecondHello}, "second Hello", "second Hello"},
		{"backwards-sequence", gatewaysim.Fault{Kind: gatewaysim.FaultBackwardsSequence}, "sequence went backwards", "sequence went backwards"},
		{"over-10MiB", gatewaysim.Fault{Kind: gatewaysim.FaultOversized, Size: MaxMessage + 1024}, "10 MiB", "10 MiB"},
		{"unknown-opcode", gatewaysim.Fault{Kind: gatewaysim.FaultUnknownOpcode}, "unknown opcode 42", ""},
		{"close-without-code", gatewaysim.Fault{Kind: gatewaysim.FaultCloseNoStatus}, "1005", "1005"},
		{"corrupt-compression", gatewaysim.Fault{Kind: gatewaysim.FaultCorruptCompression}, "", ""},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t, envConfig{flavor: v.flavor, compress: v.compress, shards: 3})
			e.start()
			for _, in := range inputs {
				reason := in.reason
				if v.flavor == core.Fluxer {
					reason = in.fluxerReason
				}
				ignored := reason == "" && in.fault.Kind == gatewaysim.FaultUnknownOpcode
				others := map[int]core.Diag{0: e.diag(0), 2: e.diag(2)}
				otherMarks := map[int]int64{0: e.mark(0), 2: e.mark(2)}
				m := e.mark(1)
				before := e.diag(1)
				e.sim.Inject(1, in.fault)
				if ignored {
					e.publish(1, 1)
					e.synced(1)
					if got := e.path(1, m); len(got) != 0 {
						t.Errorf("%s: path %v; want nothing to happen", in.name, got)
					}
				} else {
					off := e.waitBackoff(1, m)
					line := logText(e.events(1), m)[:off-m]
					if !strings.Contains(line, reason) {
						t.Errorf("%s: backoff line %q; want the reason %q", in.name, line, reason)
					}
					e.simWait("the old connection to end", func() bool { return e.sim.Stats(1).LiveSessions == 0 })
					e.publish(1, 2)
					e.clk.Advance(5 * time.Second)
					e.waitEvent(1, m, "resumed")
					e.synced(1)
					if got, want := e.path(1, m), []string{"BACKOFF", "STARTING", "READY"}; !slices.Equal(got, want) {
						t.Errorf("%s: path %v; want %v", in.name, got, want)
					}
					if d := e.diag(1); d.Reconnects != before.Reconnects+1 || d.Epoch != before.Epoch {
						t.Errorf("%s: reconnects %d -> %d, epoch %d -> %d; want one reconnect and a resume", in.name, before.Reconnects, d.Reconnects, before.Epoch, d.Epoch)
					}
				}
				if text := logText(e.events(1), 0); strings.Contains(text, "event=panic") {
					t.Fatalf("%s: a panic was recovered:\n%s", in.name, text)
				}
				e.sink.checkContiguous(t, 1)
				for id, d := range others {
					if now := e.diag(id); now.Reconnects != d.Reconnects || now.State != core.Ready || e.mark(id) != otherMarks[id] {
						t.Errorf("%s: shard %d changed: reconnects %d -> %d, state %v", in.name, id, d.Reconnects, now.Reconnects, now.State)
					}
				}
			}
		})
	}
}
