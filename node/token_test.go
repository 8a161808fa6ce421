package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// A wrong token with a fixed total (issue 22, item 11): 16 shards at
// max_concurrency 1 queue for identify slots; the first refusal, a 4004
// on the first identify or discovery's 401, sends all 16 FATAL at once
// with one token-refused line in the node's events. Before, they went
// FATAL one identify slot (5 s) at a time, each spending a start: 16
// connections to the gateway where now there is one (none after a 401).
func TestWrongTokenAllFatalAtOnce(t *testing.T) {
	const total = 16
	for _, tc := range []struct {
		name      string
		discovery bool
		conns     int64
	}{
		{"4004", false, 1},
		{"discovery-401", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, err := gatewaysim.New(gatewaysim.Config{Shards: total, MaxConcurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			cfg := Config{Flavor: core.Discord, Token: "wrong-token", Plan: core.Range(total, 0, total-1), MaxConcurrency: 1}
			if tc.discovery {
				cfg.API = sim.APIURL()
			} else {
				cfg.GatewayURL = sim.GatewayURL()
			}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.Start()
			within(t, time.Minute, fmt.Sprintf("%d shards FATAL", total), func() bool {
				for _, d := range s.Scheduler.Snapshot(nil) {
					if d.State != core.Fatal {
						return false
					}
				}
				return true
			})
			if got := sim.Accepted(); got != tc.conns {
				t.Fatalf("the simulator accepted %d connections; want %d (no identify after the first refusal)", got, tc.conns)
			}
			l := s.Scheduler.Events()
			buf := make([]byte, l.Size())
			n, _ := l.ReadAt(buf, 0)
			ev := string(buf[:n])
			if n := strings.Count(ev, "event=token-refused"); n != 1 {
				t.Fatalf("/events holds %d token-refused lines; want 1:\n%s", n, ev)
			}
			if strings.Contains(ev, "wrong-token") {
				t.Fatal("/events quotes the token")
			}
		})
	}
}
