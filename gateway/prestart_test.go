package gateway

import (
	"testing"

	"github.com/shardfs/shardfs/core"
)

// One encoding of the reserve, --identify-reserve's: negative is the
// default (1% of the total, at least 1), 0 none, N that many.
func TestNewPacerReserve(t *testing.T) {
	for _, tc := range []struct {
		reserve, want int
	}{
		{DefaultReserve, 10},
		{0, 0},
		{5, 5},
	} {
		p := NewPacer(nil, Pacing{Flavor: core.Discord, IdentifyReserve: tc.reserve, Fixed: true})
		if b := p.Budget(); b.Total != core.DiscordStartTotal || b.Reserve != tc.want {
			t.Errorf("NewPacer(reserve %d).Budget() = total %d, reserve %d; want %d, %d", tc.reserve, b.Total, b.Reserve, core.DiscordStartTotal, tc.want)
		}
	}
	if b := NewPacer(nil, Pacing{Flavor: core.Discord}).Budget(); b.Total != 0 {
		t.Errorf("without a fixed gateway URL the total is discovery's; Budget().Total = %d; want 0", b.Total)
	}
}
