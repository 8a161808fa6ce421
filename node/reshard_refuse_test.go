package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
	"github.com/shardfs/shardfs/reshard"
)

// startSmall runs a node of total shards against a fresh simulator, all
// READY.
func startSmall(t *testing.T, flavor core.Flavor, total, guilds int, cfg Config) (*Node, *gatewaysim.Server) {
	t.Helper()
	return startSmallBeating(t, flavor, total, guilds, cfg, time.Hour)
}

// startSmallBeating is startSmall with the simulator's heartbeat interval.
// The simulator never times a session out (these tests are not about
// heartbeats): on a loaded machine a heartbeat may come late, and a 4009
// would make the test depend on the scheduler.
func startSmallBeating(t *testing.T, flavor core.Flavor, total, guilds int, cfg Config, heartbeat time.Duration) (*Node, *gatewaysim.Server) {
	t.Helper()
	sf := gatewaysim.Discord
	if flavor == core.Fluxer {
		sf = gatewaysim.Fluxer
	}
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: sf, Shards: total, MaxConcurrency: 8, Guilds: guilds,
		HeartbeatInterval: heartbeat, HeartbeatTimeout: max(2*heartbeat, 2*time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	cfg.Flavor, cfg.Token, cfg.API, cfg.GatewayURL = flavor, "sim-token", sim.APIURL(), sim.GatewayURL()
	if cfg.Plan.Total == 0 {
		cfg.Plan = core.Range(total, 0, total-1)
	}
	cfg.MaxConcurrency, cfg.Intents = 8, 1<<0|1<<9
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if flavor == core.Discord && cfg.IdentifyTotal == 0 {
		discover(t, s)
	}
	s.Start()
	if err := waitReady(s, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return s, sim
}

// discover runs discovery before the start, as serve does without a
// --gateway: the transport's identify gate learns max_concurrency, so
// that both plans' identifies of a bucket reach the gateway 5 s apart
// (with a configured gateway URL alone the gate lets them through at
// once, and the simulator refuses some with op 9).
func discover(t *testing.T, s *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Transport.Discover(ctx); err != nil {
		t.Fatal(err)
	}
}

// Each refusal: one line saying why (reshard-refused, or rejected for a
// command refused as it is written, which returns the reason as the
// write's error), /reshard says refused, and the old plan goes on as it
// was.
func TestReshardRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flavor  core.Flavor
		total   int // default 4
		guilds  int
		cfg     Config
		prepare func(s *Node, sim *gatewaysim.Server)
		command string // empty: shard 1 closes 4011 (Config.Reshard)
		// atWrite, for a command: the refusal is known when it is
		// written, and is the write's error, of that kind.
		atWrite error
		want    string
	}{
		{name: "budget too small", cfg: Config{IdentifyTotal: 10, IdentifyReserve: gateway.DefaultReserve}, command: "reshard 8", atWrite: core.ErrUsage,
			want: "the new plan needs 8 identifies and the budget has 5 left above its reserve of 1"},
		{name: "as many shards as now, by hand", command: "reshard 4", atWrite: core.ErrUsage,
			want: "the new plan would have 4 shards, not more than the current 4"},
		// Discovery's 4, rounded up to max_concurrency 8, is no more
		// than the 8 shards now.
		{name: "fewer shards than now", total: 8, prepare: func(_ *Node, sim *gatewaysim.Server) { sim.SetShards(4) }, command: "reshard auto",
			want: "the new plan would have 8 shards, not more than the current 8"},
		{name: "beyond the ceiling", command: "reshard 16385", atWrite: core.ErrUsage, want: "beyond the ceiling of 16384"},
		{name: "a fourth 4011 within the hour", cfg: Config{Reshard: true},
			prepare: func(s *Node, _ *gatewaysim.Server) {
				for range reshard.MovesPerHour {
					if err := s.move.Limiter().Admit(); err != nil {
						panic(err)
					}
				}
			},
			want: "3 moves in the last hour already"},
		{name: "a fourth move by hand within the hour", command: "reshard 8", atWrite: core.ErrBusy,
			prepare: func(s *Node, _ *gatewaysim.Server) {
				for range reshard.MovesPerHour {
					if err := s.move.Limiter().Admit(); err != nil {
						panic(err)
					}
				}
			},
			want: "3 moves in the last hour already"},
		{name: "a fourth move to discovery's total within the hour", command: "reshard auto", atWrite: core.ErrBusy,
			prepare: func(s *Node, _ *gatewaysim.Server) {
				for range reshard.MovesPerHour {
					if err := s.move.Limiter().Admit(); err != nil {
						panic(err)
					}
				}
			},
			want: "3 moves in the last hour already"},
		{name: "discovery answers 0 shards", command: "reshard auto",
			prepare: func(s *Node, _ *gatewaysim.Server) { s.cfg.API = fakeDiscovery(t, `0`) },
			want:    "discovery answered 0 shards"},
		{name: "discovery answers a non-number", command: "reshard auto",
			prepare: func(s *Node, _ *gatewaysim.Server) { s.cfg.API = fakeDiscovery(t, `"eight"`) },
			want:    "malformed answer"},
		{name: "a partial plan, by hand", cfg: Config{Plan: core.Range(4, 0, 1)}, command: "reshard 8", atWrite: core.ErrUsage,
			want: "this node runs 2 of the plan's 4 shards; only a node that runs its whole plan moves"},
		{name: "a partial plan, on 4011", cfg: Config{Plan: core.Range(4, 0, 1)},
			want: "this node runs part of it (--shards, or a block of supervise)"},
		{name: "a supervised child, on 4011", prepare: func(s *Node, _ *gatewaysim.Server) { s.RefuseMoves("supervise does not move yet") },
			want: "4011: the bot outgrew its plan; supervise does not move yet"},
		{name: "a supervised child, by hand", command: "reshard auto", atWrite: core.ErrUsage,
			prepare: func(s *Node, _ *gatewaysim.Server) { s.RefuseMoves("supervise does not move yet") },
			want:    "supervise does not move yet"},
		{name: "community count fails midway", flavor: core.Fluxer, guilds: 4400, command: "reshard auto",
			prepare: func(_ *Node, sim *gatewaysim.Server) { sim.SetGuildListFault(gatewaysim.GuildListFault{FailAfter: 2}) },
			want:    "page 3 (after 400 guilds): answered 500"},
		{name: "community count loops", flavor: core.Fluxer, guilds: 4400, command: "reshard auto",
			prepare: func(_ *Node, sim *gatewaysim.Server) { sim.SetGuildListFault(gatewaysim.GuildListFault{Loop: true}) },
			want:    "does not move past guild"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total := tc.total
			if total == 0 {
				total = 4
			}
			s, sim := startSmall(t, tc.flavor, total, max(tc.guilds, 40), tc.cfg)
			if tc.prepare != nil {
				tc.prepare(s, sim)
			}
			if tc.command == "" {
				sim.SetShards(8)
				if n := sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."}); n != 1 {
					t.Fatalf("Inject(1, 4011) reached %d connections; want 1", n)
				}
			} else if handled, err := s.move.Command(tc.command); tc.atWrite == nil && (!handled || err != nil) {
				t.Fatalf("Command(%q) = %v, %v; want handled, nil (the checks run in the background)", tc.command, handled, err)
			} else if tc.atWrite != nil && (!handled || !errors.Is(err, tc.atWrite) || !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Command(%q) = %v, %v; want handled, a refusal (%v) saying %q", tc.command, handled, err, tc.atWrite, tc.want)
			}
			if tc.atWrite != nil {
				waitEvent(t, s, "event=rejected", 30*time.Second)
			} else {
				waitEvent(t, s, "event=reshard-refused", 30*time.Second)
			}
			events := string(readLog(s.events))
			if !strings.Contains(events, tc.want) {
				t.Errorf("events do not say %q:\n%s", tc.want, events)
			}
			if got := string(s.move.File()); !strings.Contains(got, "state refused\n") || !strings.Contains(got, tc.want) {
				t.Errorf("/reshard = %q; want state refused and the reason", got)
			}
			if tc.atWrite != nil && strings.Contains(events, "event=reshard-start") {
				t.Errorf("a move started after its refusal:\n%s", events)
			}
			if strings.Contains(tc.name, "supervised") && strings.Contains(events, "/ctl") {
				t.Errorf("a supervised child's refusal points at a /ctl:\n%s", events)
			}
			c, _ := s.Current()
			if c != s.Scheduler || c.Plan().Total != total {
				t.Errorf("the plan changed: %d shards", c.Plan().Total)
			}
			for _, d := range c.Snapshot(nil) {
				want := core.Ready
				if tc.command == "" && d.Shard == 1 {
					want = core.Fatal // the 4011 shard stays FATAL
				}
				if d.State != want {
					t.Errorf("shard %d is %v after the refusal; want %v", d.Shard, d.State, want)
				}
			}
		})
	}
}

// fakeDiscovery serves GET /gateway/bot answering shards with the raw JSON
// value shards, and returns its API base.
func fakeDiscovery(t *testing.T, shards string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/gateway/bot" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"url":"ws://127.0.0.1:1","shards":%s,"session_start_limit":{"total":1000,"remaining":1000,"reset_after":0,"max_concurrency":8}}`, shards)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// In a fleet (--etcd) a node refuses to move, by hand and on a 4011,
// saying why, and keeps serving its part of the plan.
func TestReshardRefusedInAFleet(t *testing.T) {
	srv := etcdtest.Start(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 4, MaxConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	a := fleetNode(t, srv.Client(), sim, "a", 4, 4)
	within(t, 60*time.Second, "a: 4 shards READY", func() bool { return readyOwned(a) == 4 })
	if handled, err := a.move.Command("reshard 8"); !handled || !errors.Is(err, reshard.ErrRefused) || !strings.Contains(err.Error(), "this node shares its plan with a fleet through etcd") {
		t.Fatalf("reshard 8 = %v, %v; want it refused as it is written, saying why", handled, err)
	}
	if err := write9(attach9(t, a), "ctl", "reshard 8\n"); err == nil || !strings.Contains(err.Error(), "this node shares its plan with a fleet through etcd") {
		t.Fatalf("reshard 8 written to /ctl = %v; want it refused, saying why", err)
	}
	waitEvent(t, a, "event=rejected cmd=reshard len=9 ", 30*time.Second)
	sim.SetShards(8)
	if n := sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."}); n != 1 {
		t.Fatalf("Inject(1, 4011) reached %d connections; want 1", n)
	}
	waitEvent(t, a, "a fleet does not move to a new plan yet", 30*time.Second)
	events := string(readLog(a.events))
	if !strings.Contains(events, "this node shares its plan with a fleet through etcd") {
		t.Errorf("the refusal of reshard 8 does not say why:\n%s", events)
	}
	if strings.Contains(events, "event=reshard-start") {
		t.Errorf("a move started in a fleet:\n%s", events)
	}
	if c, _ := a.Current(); c != a.Scheduler || readyOwned(a) != 3 {
		t.Errorf("after the refusals: plan of %d, %d shards READY; want the same plan, 3 READY (shard 1 FATAL)", c.Plan().Total, readyOwned(a))
	}
}

func TestReshardBadCommands(t *testing.T) {
	s, _ := startSmall(t, core.Discord, 2, 40, Config{})
	for _, line := range []string{"reshard", "reshard x", "reshard 0", "reshard -3", "reshard 4 5"} {
		handled, err := s.move.Command(line)
		if !handled || !errors.Is(err, core.ErrUsage) || !strings.Contains(err.Error(), "usage: reshard N|auto") {
			t.Errorf("command(%q) = %v, %v; want an ErrUsage with the usage", line, handled, err)
		}
	}
	if handled, _ := s.move.Command("reset all"); handled {
		t.Error(`command("reset all") was handled; want it left to the core`)
	}
	// The tree logs a hook's refusal (TestReshardRefusedOnWrite),
	// the mover does not: one line per refusal.
	if ev := string(readLog(s.events)); strings.Contains(ev, "event=rejected") {
		t.Errorf("the mover logged a refusal itself:\n%s", ev)
	}
}

// A 4011 of the new plan during a move aborts it: the new sessions end,
// the old plan keeps serving.
func TestReshardAbortedByNewPlan4011(t *testing.T) {
	s, sim := startSmall(t, core.Discord, 4, 40, Config{})
	if _, err := s.move.Command("reshard 8"); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, s, "event=reshard-start", 30*time.Second)
	// Shard 5 exists only in the new plan.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sim.Wait(ctx, func() bool { return sim.Stats(5).LiveSessions == 1 }); err != nil {
		t.Fatalf("shard 5 of the new plan never connected: %v", err)
	}
	if n := sim.Inject(5, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4011, Reason: "Sharding required."}); n != 1 {
		t.Fatalf("Inject(5, 4011) reached %d connections; want 1", n)
	}
	waitEvent(t, s, "event=reshard-aborted", 30*time.Second)
	if got := string(s.move.File()); !strings.Contains(got, "state aborted\n") || !strings.Contains(got, "shard 5 of the new plan") {
		t.Errorf("/reshard = %q; want state aborted naming shard 5", got)
	}
	c, _ := s.Current()
	if c != s.Scheduler {
		t.Fatal("the node switched plans after an abort")
	}
	for _, d := range c.Snapshot(nil) {
		if d.State != core.Ready {
			t.Errorf("old shard %d is %v; want READY", d.Shard, d.State)
		}
	}
	// A later move is possible again.
	if _, err := s.move.Command("reshard 8"); err != nil {
		t.Errorf("reshard after an abort = %v; want it to start", err)
	}
}

// attach9 serves the node's tree on one end of a pipe and attaches to it
// with 9fans.net/go's client (9P2000, whose errors carry their text).
func attach9(t *testing.T, s *Node) *client.Fsys {
	t.Helper()
	c, srv := net.Pipe()
	go s.Server.ServeConn(context.Background(), srv)
	t.Cleanup(func() { c.Close() })
	conn, err := client.NewConn(c)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// attachL is attach9 with the hugelgupf/p9 client (9P2000.L, errnos).
func attachL(t *testing.T, s *Node) p9.File {
	t.Helper()
	c, srv := net.Pipe()
	go s.Server.ServeConn(context.Background(), srv)
	t.Cleanup(func() { c.Close() })
	cl, err := p9.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	root, err := cl.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func write9(fsys *client.Fsys, path, text string) error {
	f, err := fsys.Open(path, plan9.OWRITE|plan9.OTRUNC)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write([]byte(text))
	return err
}

func read9(t *testing.T, fsys *client.Fsys, path string) string {
	t.Helper()
	f, err := fsys.Open(path, plan9.OREAD)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

func writeL(t *testing.T, root p9.File, path, text string) error {
	t.Helper()
	_, f, err := root.Walk([]string{path})
	if err != nil {
		t.Fatalf("walk %s: %v", path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(text), 0)
	return err
}

// A `reshard` that can be refused when it is written is refused then,
// through the tree: the writer gets the reason (9P2000) or its errno
// (9P2000.L), /events an event=rejected line, /reshard the refusal; no
// move starts. A move already running makes a further one busy.
func TestReshardRefusedOnWrite(t *testing.T) {
	s, _ := startSmall(t, core.Discord, 4, 40, Config{})
	gate := make(chan struct{})
	defer close(gate)
	s.move.HoldSwitch(gate)
	fsys, root := attach9(t, s), attachL(t, s)

	const same = "reshard refused: the new plan would have 4 shards, not more than the current 4"
	if err := write9(fsys, "ctl", "reshard 4\n"); err == nil || err.Error() != "invalid argument: "+same {
		t.Fatalf("9P2000 reshard 4 on a plan of 4 = %v; want %q", err, "invalid argument: "+same)
	}
	if err := writeL(t, root, "ctl", "reshard 4\n"); !errors.Is(err, linux.EINVAL) {
		t.Fatalf("9P2000.L reshard 4 on a plan of 4 = %v; want EINVAL", err)
	}
	if got := read9(t, fsys, "reshard"); !strings.HasPrefix(got, "state refused\nold_total 4\nnew_total 4\n") || !strings.Contains(got, "reason "+same+"\n") {
		t.Errorf("/reshard = %q; want state refused and the reason", got)
	}
	if events := read9(t, fsys, "events"); !strings.Contains(events, `event=rejected cmd=reshard len=9 err="`+same+`"`) {
		t.Errorf("/events has no rejected line with the reason:\n%s", events)
	}
	if err := write9(fsys, "ctl", "reshard 16385\n"); err == nil || !strings.Contains(err.Error(), "beyond the ceiling of 16384") {
		t.Errorf("9P2000 reshard 16385 = %v; want the ceiling named", err)
	}

	if err := write9(fsys, "ctl", "reshard 8\n"); err != nil {
		t.Fatalf("9P2000 reshard 8 = %v; want the move started", err)
	}
	waitEvent(t, s, "event=reshard-start", 30*time.Second)
	const running = "busy: a move to a new plan is running (to 8 shards)"
	if err := write9(fsys, "ctl", "reshard 16\n"); err == nil || err.Error() != running {
		t.Errorf("9P2000 reshard 16 during a move = %v; want %q", err, running)
	}
	if err := writeL(t, root, "ctl", "reshard auto\n"); !errors.Is(err, linux.EBUSY) {
		t.Errorf("9P2000.L reshard auto during a move = %v; want EBUSY", err)
	}
	if got := read9(t, fsys, "reshard"); !strings.HasPrefix(got, "state starting\nold_total 4\nnew_total 8\n") {
		t.Errorf("/reshard after refusals during a move = %q; want the move still starting", got)
	}
	if strings.Count(string(readLog(s.events)), "event=reshard-start") != 1 {
		t.Errorf("more than one move started:\n%s", readLog(s.events))
	}
}
