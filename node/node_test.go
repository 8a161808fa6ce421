package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
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
		{"ws://127.0.0.1:1", 0, gateway.DefaultReserve, 1000, 10},
		{"ws://127.0.0.1:1", 200, 5, 200, 5},
		{"ws://127.0.0.1:1", 200, 0, 200, 0},
		{"", 0, gateway.DefaultReserve, 0, 0}, // discovery will say
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

// memStore is a SessionStore in memory, shared by two nodes in turn as a
// folder is by two processes.
type memStore struct {
	mu    sync.Mutex
	snaps map[int]core.Snapshot
}

func (m *memStore) Load(_ context.Context, shard int) (core.Snapshot, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.snaps[shard]
	return s, ok, nil
}

func (m *memStore) Save(_ context.Context, shard int, s core.Snapshot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snaps[shard] = s
	return nil
}

// Config.Sessions reaches the core: a node closed cleanly leaves its
// sessions in the store and the next node on that store resumes them, for
// both flavors. Fluxer's snapshots are checked against Config.Gateway,
// which defaults to GatewayURL: given with a query (as --gateway may be),
// it still names the endpoint the sessions resume on.
func TestSessionsSurviveANode(t *testing.T) {
	for _, tc := range []struct {
		flavor core.Flavor
		sim    gatewaysim.Flavor
		query  string
	}{
		{core.Discord, gatewaysim.Discord, ""},
		{core.Fluxer, gatewaysim.Fluxer, "/?v=1&encoding=json"},
	} {
		t.Run(tc.flavor.String(), func(t *testing.T) {
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: tc.sim, Shards: 2, MaxConcurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			store := &memStore{snaps: map[int]core.Snapshot{}}
			cfg := Config{Flavor: tc.flavor, Token: "sim-token", GatewayURL: sim.GatewayURL() + tc.query,
				Plan: core.Range(2, 0, 1), MaxConcurrency: 2, Sessions: store}
			for run := 1; run <= 2; run++ {
				s, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				if err := waitReady(s, 30*time.Second); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				if run == 2 {
					for id := range 2 {
						if d, _ := s.Scheduler.Diag(id); !d.Restored {
							t.Errorf("run 2: shard %d did not restore its session: %+v", id, d)
						}
					}
				}
				s.Close()
			}
			if tot := sim.Totals(); tot.Identifies != 2 || tot.Resumes != 2 || tot.MaxLiveSessions != 1 {
				t.Errorf("simulator: %d identifies, %d resumes, at most %d live sessions a shard; want 2, 2, 1", tot.Identifies, tot.Resumes, tot.MaxLiveSessions)
			}
		})
	}
}

// waitReady waits for every shard of s to be READY, looking again at every
// lifecycle event.
func waitReady(s *Node, bound time.Duration) error {
	timeout := time.After(bound)
	for {
		notify := s.Scheduler.Events().Notify()
		ready := true
		for _, d := range s.Scheduler.Snapshot(nil) {
			ready = ready && d.State == core.Ready
		}
		if ready {
			return nil
		}
		select {
		case <-notify:
		case <-timeout:
			return fmt.Errorf("the shards were not all READY within %v", bound)
		}
	}
}
