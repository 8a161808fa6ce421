package interop

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/disgoorg/disgo/gateway"
	"github.com/disgoorg/disgo/rest"
	"github.com/disgoorg/disgo/sharding"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"go.uber.org/goleak"
)

// disgoDiscover asks the simulator's GET /gateway/bot through disgo's REST
// client, as disgo's bot builder does, and checks what it understood.
func disgoDiscover(t *testing.T, sim *gatewaysim.Server, rec *recorder) string {
	t.Helper()
	tr := &http.Transport{}
	defer closeIdle(tr)
	// The default REST rate limiter starts a cleanup goroutine that never
	// ends; the no-op limiter does not.
	client := rest.NewClient(token,
		rest.WithURL(sim.APIURL()),
		rest.WithHTTPClient(&http.Client{Transport: tr, Timeout: wait}),
		rest.WithRateLimiter(rest.NewNoopRateLimiter()),
		rest.WithLogger(newTestLog(t, rec)),
	)
	defer client.Close(context.Background())
	gw, err := rest.NewGateway(client).GetGatewayBot()
	if err != nil {
		t.Fatalf("GetGatewayBot: %v", err)
	}
	cfg := sim.Config()
	if gw.URL != sim.GatewayURL() || gw.Shards != cfg.Shards ||
		gw.SessionStartLimit.MaxConcurrency != cfg.MaxConcurrency ||
		gw.SessionStartLimit.Total != cfg.SessionStartLimit || gw.SessionStartLimit.Remaining > gw.SessionStartLimit.Total {
		t.Fatalf("GetGatewayBot = %+v; want url %s, %d shards, max_concurrency %d", gw, sim.GatewayURL(), cfg.Shards, cfg.MaxConcurrency)
	}
	return gw.URL
}

// disgoHandler feeds a recorder from disgo's gateway events. disgo calls it
// on each shard's reader goroutine.
func disgoHandler(rec *recorder) gateway.EventHandlerFunc {
	return func(typ gateway.EventType, _ int, shardID int, ev gateway.EventData) {
		switch e := ev.(type) {
		case gateway.EventReady:
			info := readyInfo{SessionID: e.SessionID, Shard: e.Shard, ResumeURL: e.ResumeGatewayURL}
			for _, g := range e.Guilds {
				info.Guilds = append(info.Guilds, g.ID.String())
			}
			rec.update(func(r *recorder) { r.readies = append(r.readies, info) })
		case gateway.EventGuildCreate:
			if e.Name == "" || len(e.Channels) == 0 || len(e.Roles) == 0 {
				rec.problem("shard %d: GUILD_CREATE %s decoded without name, channels or roles", shardID, e.ID)
			}
			rec.update(func(r *recorder) { r.guilds[e.ID.String()]++ })
		case gateway.EventMessageCreate:
			if e.ID == 0 || e.ChannelID == 0 || e.Author.ID == 0 || e.CreatedAt.IsZero() {
				rec.problem("shard %d: MESSAGE_CREATE decoded incompletely: %+v", shardID, e.Message)
			}
			rec.message(e.Content)
		case gateway.EventHeartbeatAck:
			rec.update(func(r *recorder) { r.acks++ })
		default:
			if typ == gateway.EventTypeResumed {
				rec.update(func(r *recorder) { r.resumed++ })
			}
		}
	}
}

// TestDisgo runs disgo v0.18.15's shard manager with both shards of a
// two-shard bot against the simulator: discovery through disgo's REST
// client, READY and GUILD_CREATE on each shard, published and generated
// dispatches, then op 7 (Drain, both shards) and a dropped TCP connection
// (shard 1), after each of which disgo must resume on resume_gateway_url
// without losing or duplicating an event.
//
// disgo v0.18.15 offers only per-payload compression (identify "compress",
// on by default, binary frames inflated one by one); it has no zlib-stream
// or zstd-stream option. Both identify compress values are run.
//
// disgo v0.18.15 has data races of its own (see runWithoutRace), which the
// race detector reports whatever the peer does. Under -race this test therefore
// runs itself again in a child `go test` built without it; the simulator's
// side is race-checked by TestDiscordgo and by its own package's tests.
func TestDisgo(t *testing.T) {
	if raceEnabled && os.Getenv(disgoChildEnv) == "" {
		runWithoutRace(t, "TestDisgo", disgoChildEnv)
		return
	}
	for _, compress := range []bool{true, false} {
		t.Run("compress="+strconv.FormatBool(compress), func(t *testing.T) {
			testDisgo(t, compress)
		})
	}
}

func testDisgo(t *testing.T, compress bool) {
	// disgo v0.18.15 starts a heartbeat goroutine per connection, which
	// stores its cancel function in the gateway from inside itself. When a
	// connection ends before that goroutine has run (seen under load, when a
	// forced disconnect follows a resume by well under a millisecond),
	// CloseWithCode cancels the previous goroutine's context and the new
	// one is never stopped. At most one such goroutine per test is
	// tolerated and logged; more would be a systematic leak.
	leakedBefore := goroutinesAt(disgoHeartbeat)
	t.Cleanup(func() {
		verifyNoLeaks(t, goleak.IgnoreTopFunction(disgoHeartbeat))
		if n := goroutinesAt(disgoHeartbeat) - leakedBefore; n > 1 {
			t.Errorf("disgo leaked %d heartbeat goroutines", n)
		} else if n == 1 {
			t.Logf("disgo leaked its heartbeat goroutine (known race on heartbeatCancel)")
		}
	})
	rec := newRecorder()
	// A heartbeat interval of an hour, so that disgo's heartbeat ticker
	// never fires, not even in a goroutine leaked as above: a tick that
	// coincides with Close makes disgo v0.18.15 panic (Close sets
	// LastSequenceReceived to nil, and the heartbeat goroutine's select may
	// still take the tick and dereference it, gateway_impl.go:260; so does
	// a tick before the first READY, or any tick of a leaked goroutine after
	// Close). Heartbeats are asked for with op 1 instead.
	sim := newSim(t, rec, func(c *gatewaysim.Config) { c.HeartbeatInterval = time.Hour })
	const total = 2
	url := disgoDiscover(t, sim, rec)
	log := newTestLog(t, rec)
	dials := new(gate)
	t.Cleanup(dials.open)

	// Quirks worked around: disgo's client builder would open shards
	// 0..N-2 plus shard 0 twice, so the shard manager is used with the
	// shard ids passed explicitly; and with max_concurrency above 1 its
	// Open creates shards concurrently into an unguarded map ("concurrent
	// map writes"), so shards are opened one at a time with OpenShard.
	m := sharding.New(token, disgoHandler(rec),
		sharding.WithShardCount(total),
		sharding.WithShardIDs(0, 1),
		sharding.WithLogger(log),
		sharding.WithRateLimiterConfigOpt(
			sharding.WithMaxConcurrency(sim.Config().MaxConcurrency),
			sharding.WithRateLimiterLogger(log),
		),
		sharding.WithGatewayConfigOpts(
			gateway.WithURL(url),
			gateway.WithCompress(compress),
			gateway.WithIntents(gateway.IntentGuilds, gateway.IntentGuildMessages, gateway.IntentDirectMessages),
			gateway.WithDialer(dials.dialer()),
			gateway.WithLogger(log),
			gateway.WithRateLimiterConfigOpts(gateway.WithRateLimiterLogger(log)),
		),
	)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	closed := false
	t.Cleanup(func() {
		if !closed {
			m.Close(context.Background())
		}
	})
	for shard := range total {
		if err := m.OpenShard(ctx, shard); err != nil {
			t.Fatalf("OpenShard(%d): %v", shard, err)
		}
	}

	// READY and GUILD_CREATE on both shards.
	var want []string
	for shard := range total {
		want = append(want, guildIDs(sim.Guilds(shard, total))...)
	}
	rec.until(t, "both READYs and every GUILD_CREATE", func(r *recorder) bool {
		if len(r.readies) < total {
			return false
		}
		for _, g := range want {
			if r.guilds[g] == 0 {
				return false
			}
		}
		return true
	})
	rec.view(func(r *recorder) {
		seen := map[int]bool{}
		for _, ready := range r.readies {
			shard := ready.Shard[0]
			seen[shard] = true
			if ready.Shard[1] != total || ready.SessionID == "" || ready.ResumeURL != sim.ResumeURL() {
				t.Errorf("READY %+v; want shard [n %d], a session id, resume url %s", ready, total, sim.ResumeURL())
			}
			if fmt.Sprint(ready.Guilds) != fmt.Sprint(guildIDs(sim.Guilds(shard, total))) {
				t.Errorf("READY of shard %d guilds = %v, want %v", shard, ready.Guilds, sim.Guilds(shard, total))
			}
		}
		if len(seen) != total || len(r.readies) != total {
			t.Errorf("READY for shards %v (%d READYs), want each of 0..%d once", seen, len(r.readies), total-1)
		}
	})
	for shard := range total {
		if ss := sim.Sessions(shard); len(ss) != 1 || ss[0].Total != total {
			t.Fatalf("simulator sessions of shard %d = %+v, want one of total %d", shard, ss, total)
		}
	}
	// Heartbeat requests (op 1): disgo answers at once, the simulator ACKs.
	if n := sim.Inject(gatewaysim.AllShards, gatewaysim.Fault{Kind: gatewaysim.FaultHeartbeatRequest}); n != total {
		t.Fatalf("heartbeat request reached %d connections, want %d", n, total)
	}
	rec.until(t, "heartbeat ACKs on both shards", func(r *recorder) bool { return r.acks >= total })
	simWait(t, sim, "a heartbeat from each shard", func() bool {
		return sim.Stats(0).Heartbeats >= 1 && sim.Stats(1).Heartbeats >= 1
	})

	// Dispatches on both shards: marked events, then a burst of generated
	// ones on shard 0.
	pubs := []*publisher{
		{t: t, sim: sim, shard: 0, total: total},
		{t: t, sim: sim, shard: 1, total: total},
	}
	publishAll := func() {
		for _, p := range pubs {
			p.publish()
		}
	}
	allSent := func() int { return len(pubs[0].sent) + len(pubs[1].sent) }
	publishAll()
	publishAll()
	const flood = 200
	if n := sim.Flood(0, flood); n != 1 {
		t.Fatalf("Flood reached %d sessions, want 1", n)
	}
	rec.until(t, "published and flooded MESSAGE_CREATEs", func(r *recorder) bool {
		return len(r.order) == allSent() && r.other == flood
	})

	// Forced reconnect 1: op 7 to both shards. disgo closes with 1012 and
	// resumes on resume_gateway_url. Its dials are held until both sessions
	// are detached and an event has been published to each, which only the
	// resumes' replays can then deliver.
	dials.close()
	if n := sim.Drain(); n != total {
		t.Fatalf("Drain told %d connections, want %d", n, total)
	}
	offline(t, sim, 0, 1)
	publishAll()
	dials.open()
	simWait(t, sim, "both shards resumed after op 7", func() bool {
		return sim.Stats(0).Resumes >= 1 && sim.Stats(1).Resumes >= 1
	})
	rec.until(t, "RESUMED on both shards", func(r *recorder) bool { return r.resumed >= total })
	publishAll()
	rec.until(t, "events after op 7", func(r *recorder) bool { return len(r.order) == allSent() })

	// Forced reconnect 2: shard 1's TCP connection is reset without a close
	// frame; again an event is published while it is offline.
	dials.close()
	if n := sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultDrop}); n != 1 {
		t.Fatalf("FaultDrop reached %d connections, want 1", n)
	}
	offline(t, sim, 1)
	pubs[1].publish()
	dials.open()
	simWait(t, sim, "shard 1 resumed after drop", func() bool { return sim.Stats(1).Resumes >= 2 })
	rec.until(t, "RESUMED after drop", func(r *recorder) bool { return r.resumed >= total+1 })
	// Quirk: disgo, like discordgo, stores RESUMED's null "s" as sequence
	// 0; its next heartbeat reports 0. Nothing is published between
	// RESUMED and this heartbeat request.
	sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultHeartbeatRequest})
	simWait(t, sim, "a heartbeat reporting sequence 0 after RESUMED", func() bool {
		ss := sim.Sessions(1)
		return sim.Stats(1).Heartbeats >= 2 && len(ss) == 1 && ss[0].Live && ss[0].Acked == 0
	})
	publishAll()
	rec.until(t, "events after drop", func(r *recorder) bool { return len(r.order) == allSent() })
	for shard, replayed := range []int64{1, 2} {
		if st := sim.Stats(shard); st.ReplayedEvents != replayed {
			t.Errorf("shard %d: resumes replayed %d events, want %d", shard, st.ReplayedEvents, replayed)
		}
	}

	for _, p := range pubs {
		var mine []string
		rec.view(func(r *recorder) {
			for _, m := range r.order {
				if len(m) > len(markerPrefix) && m[len(markerPrefix)] == byte('0'+p.shard) {
					mine = append(mine, m)
				}
			}
		})
		if fmt.Sprint(mine) != fmt.Sprint(p.sent) {
			t.Errorf("shard %d received %q, published %q (want each once, in order)", p.shard, mine, p.sent)
		}
	}
	rec.view(func(r *recorder) {
		for m, n := range r.markers {
			if n != 1 {
				t.Errorf("marker %q received %d times", m, n)
			}
		}
	})
	for shard, resumes := range []int64{1, 2} {
		st := sim.Stats(shard)
		if st.Identifies != 1 || st.Resumes != resumes || st.FailedResumes != 0 || st.MaxLiveSessions != 1 {
			t.Errorf("shard %d stats = %+v, want 1 identify, %d resumes, no failed resume, never 2 live sessions", shard, st, resumes)
		}
	}
	rec.view(func(r *recorder) {
		if fmt.Sprint(r.resumeVia) != "[true true true]" {
			t.Errorf("resumes via resume_gateway_url: %v, want all three", r.resumeVia)
		}
		if len(r.readies) != total {
			t.Errorf("%d READY events, want %d (resumes only)", len(r.readies), total)
		}
		for _, p := range r.problems {
			t.Errorf("library problem: %s", p)
		}
	})

	// Close sends 1000 on each shard, which ends both sessions.
	closed = true
	m.Close(ctx)
	simWait(t, sim, "sessions ended by close 1000", func() bool {
		return len(sim.Sessions(0)) == 0 && len(sim.Sessions(1)) == 0
	})
}

// disgoHeartbeat is disgo's per-connection heartbeat goroutine, as goleak
// names it.
const disgoHeartbeat = "github.com/disgoorg/disgo/gateway.(*gatewayImpl).heartbeat"

// disgoChildEnv marks the child test process that runs TestDisgo without
// the race detector.
const disgoChildEnv = "INTEROP_DISGO_NO_RACE"

// disgo v0.18.15's gateway package (gateway/gateway_impl.go) has data
// races of its own, between its reader, heartbeat and reconnect goroutines,
// whatever the peer does:
//
//   - heartbeat (lines 237-238) assigns heartbeatCancel on its own
//     goroutine while CloseWithCode (lines 134-136) reads and calls it from
//     the reader goroutine (op 7, op 9, a read error) or from the caller of
//     Close: reported on every reconnect and every Close;
//   - sendHeartbeat (line 260, heartbeat goroutine) reads
//     config.LastSequenceReceived, which the reader goroutine assigns on
//     every dispatch (lines 373, 393) without a lock;
//   - open (line 94, reconnect goroutine) writes lastHeartbeatSent, which
//     sendHeartbeat also writes.
//
// The last two need the heartbeat ticker to fire, which TestDisgo avoids;
// the first cannot be avoided, hence the child process without -race.
//
// runWithoutRace runs one test of this package in a child `go test` built
// without the race detector, and fails if the child does not pass it.
func runWithoutRace(t *testing.T, test, env string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	timeout := 5 * time.Minute
	if d, ok := t.Deadline(); ok {
		timeout = time.Until(d) - 10*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "test", "-count=1", "-v", "-run", "^"+test+"$", ".")
	var flags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if f != "-race" && f != "-race=true" {
			flags = append(flags, f)
		}
	}
	cmd.Env = append(os.Environ(), env+"=1", "GOFLAGS="+strings.Join(flags, " "))
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+test+" ")) {
		t.Fatalf("%s in a child go test without -race: %v\n%s", test, err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, "--- ") {
			t.Logf("child: %s", strings.TrimSpace(line))
		}
	}
}
