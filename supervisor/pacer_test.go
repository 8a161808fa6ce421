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
