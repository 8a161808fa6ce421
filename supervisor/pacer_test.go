package supervisor

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// TestSpacedPacer: the grants of one bucket leave 5 s + GrantMargin
// apart; a cancelled held grant never comes.
func TestSpacedPacer(t *testing.T) {
	clk := clock.NewFake()
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 2), true, clk)
	if now, _ := p.Request(0, false, func() { t.Error("shard 0 granted twice") }); !now {
		t.Fatal("the first request waits")
	}
	if now, _ := p.Request(1, false, func() { t.Error("shard 1 granted twice") }); !now {
		t.Fatal("another bucket's first request waits")
	}
	granted := 0
	if now, _ := p.Request(2, false, func() { granted++ }); now {
		t.Fatal("shard 2 granted at once in bucket 0")
	}
	cancelledGrant := false
	_, cancel := p.Request(3, false, func() { cancelledGrant = true })
	clk.Advance(core.DiscordWindow)
	if granted != 0 {
		t.Fatal("granted at 5 s, without the margin")
	}
	cancel()
	clk.Advance(GrantMargin)
	if granted != 1 {
		t.Fatalf("granted %d times at 5 s + margin; want 1", granted)
	}
	clk.Advance(time.Minute)
	if cancelledGrant {
		t.Fatal("a cancelled request was granted")
	}
}

// TestSpacedPacerTaken: once the child says when it took a grant, the
// bucket's next grant goes 5 s after that time, not 5 s + GrantMargin
// after the parent's grant; a stale report (older than the last grant) is
// ignored.
func TestSpacedPacerTaken(t *testing.T) {
	clk := clock.NewFake()
	p := NewSpacedPacer(core.NewDiscordPacer(clk, 1), true, clk)
	t0 := clk.Now()
	if now, _ := p.Request(0, false, func() {}); !now {
		t.Fatal("the first request waits")
	}
	const hop = 3 * time.Millisecond
	p.Taken(0, t0.Add(hop))
	granted := 0
	p.Request(1, false, func() { granted++ })
	clk.Advance(core.DiscordWindow + hop - time.Millisecond)
	if granted != 0 {
		t.Fatal("granted less than 5 s after the child took the previous grant")
	}
	clk.Advance(time.Millisecond)
	if granted != 1 {
		t.Fatalf("granted %d times 5 s after the child took the previous grant; want 1", granted)
	}
	// A stale report: older than the last grant.
	p.Taken(0, t0.Add(2*hop))
	p.Request(2, false, func() { granted++ })
	clk.Advance(core.DiscordWindow)
	if granted != 1 {
		t.Fatal("a stale report paced the next grant")
	}
	clk.Advance(GrantMargin)
	if granted != 2 {
		t.Fatalf("granted %d; want the grant at 5 s + margin without a report", granted)
	}
}
