package core_test

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// The issue-11 overspend: a connection's own discovery runs after its
// identify slot was granted, before the identify reached the gateway, so
// the answer counts none of the identifies in flight. Raising remaining
// from such an answer let the node spend more than session_start_limit.
func TestPacerLaggingAnswerNeverRaises(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	lag := core.StartLimit{Total: 5, Remaining: 5, ResetAfter: 24 * time.Hour, MaxConcurrency: 1}
	granted := 0
	for i := range 20 {
		if now, _ := p.Request(0, false, func() { granted++ }); now {
			granted++
		}
		if i%3 == 0 {
			// Every rediscovery answers as if none of ours was sent.
			p.SetStartLimit(lag)
		}
		clk.Advance(core.DiscordWindow)
	}
	// 5 starts, the last one the operator's reserve.
	if granted != 4 {
		t.Fatalf("%d automatic identifies granted with session_start_limit.total 5; want 4 (the last start is the reserve)", granted)
	}
}
