package supervisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
)

// The token never leaves a Config through fmt or slog.
func TestConfigHidesToken(t *testing.T) {
	const token = "MTIzNDU2Nzg5MDEyMzQ1Njc4.secret.token"
	cfg := Config{Flavor: core.Discord, Token: token, Plan: core.Plan{Total: 4, Local: []int{0, 1}}}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "cfg", cfg)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg)
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%s", cfg), fmt.Sprintf("%q", cfg), logged.String()} {
		if strings.Contains(s, "secret") {
			t.Errorf("the token shows: %s", s)
		}
		if !strings.Contains(s, "redacted") {
			t.Errorf("no trace of the token's place: %s", s)
		}
	}
}

// With --gateway no discovery says the session start limit: the budget is
// Discord's documented 1,000 a day, or --identify-total; the reserve is
// 1% unless --identify-reserve says otherwise. Fluxer's is its window.
func TestIdentifyBudgetWithoutDiscovery(t *testing.T) {
	for _, tc := range []struct {
		gateway             string
		total, reserve      int
		wantTotal, wantRsrv int
	}{
		{"ws://127.0.0.1:1", 0, 0, 1000, 10},
		{"ws://127.0.0.1:1", 200, 5, 200, 5},
		{"ws://127.0.0.1:1", 200, -1, 200, 0},
		{"", 0, 0, 0, 0}, // discovery will say
	} {
		s, err := New(Config{Flavor: core.Discord, Token: "t", GatewayURL: tc.gateway, Plan: core.Range(1, 0, 0),
			IdentifyTotal: tc.total, IdentifyReserve: tc.reserve})
		if err != nil {
			t.Fatal(err)
		}
		if b := s.Pacer.Budget(); b.Total != tc.wantTotal || b.Remaining != tc.wantTotal || b.Reserve != tc.wantRsrv {
			t.Errorf("gateway %q, --identify-total %d, reserve %d: %+v; want total %d, reserve %d", tc.gateway, tc.total, tc.reserve, b, tc.wantTotal, tc.wantRsrv)
		}
		s.Close()
	}
	s, err := New(Config{Flavor: core.Fluxer, Token: "t", Plan: core.Range(1, 0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b := s.Pacer.Budget(); b.Total != 300 || b.Remaining != 300 || b.Reserve != 0 {
		t.Errorf("Fluxer: %+v; want total 300, remaining 300, no reserve", b)
	}
}
