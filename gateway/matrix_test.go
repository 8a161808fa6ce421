package gateway

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// outcome is what a fault should lead to.
type outcome int

const (
	// resumes: BACKOFF, then a resume on a new connection.
	resumes outcome = iota
	// resumesAtOnce: like resumes, with no wait (op 7).
	resumesAtOnce
	// identifies: BACKOFF, then a new session on a new connection.
	identifies
	// resumeRefused: BACKOFF, a resume the gateway refuses with op 9 (the
	// session is gone), and a new session on that same socket (Fluxer).
	resumeRefused
	// identifiesOnSocket: a new session on the same socket (Fluxer op 9).
	identifiesOnSocket
	// fatal: FATAL, no further connection.
	fatal
	// unaffected: nothing happens to the session.
	unaffected
)

func (o outcome) String() string {
	return [...]string{"resumes", "resumes-at-once", "identifies", "resume-refused", "identifies-on-socket", "fatal", "unaffected"}[o]
}

// want is what the events log, the core and the simulator must show.
func (o outcome) want() (path []string, reconnects, identifiesN, resumesN int64, sessions int) {
	switch o {
	case resumes, resumesAtOnce:
		return []string{"READY", "BACKOFF", "STARTING", "READY"}, 1, 0, 1, 1
	case identifies, resumeRefused:
		return []string{"READY", "BACKOFF", "STARTING", "READY"}, 1, 1, 0, 2
	case identifiesOnSocket:
		return []string{"READY", "STARTING", "READY"}, 0, 1, 0, 2
	case fatal:
		return []string{"READY", "FATAL"}, 0, 0, 0, 1
	}
	return []string{"READY"}, 0, 0, 0, 1
}

type matrixRow struct {
	name            string
	fault           gatewaysim.Fault
	discord, fluxer outcome
	// stall marks faults that only show through heartbeats: the row runs
	// with a 10 s heartbeat interval and drives the clock through two
	// heartbeats.
	stall bool
}

func closeRow(code int, discord, fluxer outcome) matrixRow {
	return matrixRow{name: fmt.Sprintf("close-%d", code), fault: gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: code}, discord: discord, fluxer: fluxer}
}

var matrix = []matrixRow{
	closeRow(4000, resumes, resumes),
	closeRow(4001, resumes, resumes),
	closeRow(4002, resumes, resumes),
	closeRow(4003, resumes, resumes),
	closeRow(4004, fatal, fatal),
	closeRow(4005, resumes, resumes),
	closeRow(4007, identifies, identifies),
	closeRow(4008, resumes, resumes), // rate limited
	closeRow(4009, identifies, identifies),
	closeRow(4010, fatal, fatal),
	closeRow(4011, fatal, fatal),
	closeRow(4012, fatal, fatal),
	// Not Fluxer codes: transient there; the simulator ended the session,
	// so the resume is refused and the shard identifies on that socket.
	closeRow(4013, fatal, resumeRefused),
	closeRow(4014, fatal, resumeRefused),
	closeRow(1000, identifies, identifies),
	closeRow(1001, identifies, identifies),
	{name: "close-no-status", fault: gatewaysim.Fault{Kind: gatewaysim.FaultCloseNoStatus}, discord: resumes, fluxer: resumes},
	{name: "drop", fault: gatewaysim.Fault{Kind: gatewaysim.FaultDrop}, discord: resumes, fluxer: resumes},
	{name: "zombie", fault: gatewaysim.Fault{Kind: gatewaysim.FaultStopAcks}, discord: resumes, fluxer: resumes, stall: true},
	{name: "slow-server", fault: gatewaysim.Fault{Kind: gatewaysim.FaultDelay, Delay: 30 * time.Second}, discord: resumes, fluxer: resumes, stall: true},
	{name: "op7-reconnect", fault: gatewaysim.Fault{Kind: gatewaysim.FaultReconnect}, discord: resumesAtOnce, fluxer: resumesAtOnce},
	{name: "op9-true", fault: gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession, Resumable: true}, discord: resumes, fluxer: identifiesOnSocket},
	{name: "op9-false", fault: gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession}, discord: identifies, fluxer: identifiesOnSocket},
	{name: "op1-heartbeat-request", fault: gatewaysim.Fault{Kind: gatewaysim.FaultHeartbeatRequest}, discord: unaffected, fluxer: unaffected},
	{name: "garbage", fault: gatewaysim.Fault{Kind: gatewaysim.FaultGarbage}, discord: resumes, fluxer: resumes},
	{name: "invalid-json", fault: gatewaysim.Fault{Kind: gatewaysim.FaultInvalidJSON}, discord: resumes, fluxer: resumes},
	{name: "corrupt-frame", fault: gatewaysim.Fault{Kind: gatewaysim.FaultCorruptCompression}, discord: resumes, fluxer: resumes},
	{name: "oversized-frame", fault: gatewaysim.Fault{Kind: gatewaysim.FaultOversized}, discord: resumes, fluxer: resumes},
	{name: "second-hello", fault: gatewaysim.Fault{Kind: gatewaysim.FaultSecondHello}, discord: resumes, fluxer: resumes},
	{name: "backwards-sequence", fault: gatewaysim.Fault{Kind: gatewaysim.FaultBackwardsSequence}, discord: resumes, fluxer: resumes},
	// Fluxer's registry: a client "MUST NOT close or reconnect solely
	// because the server used an opcode newer than this registry".
	{name: "unknown-opcode", fault: gatewaysim.Fault{Kind: gatewaysim.FaultUnknownOpcode}, discord: resumes, fluxer: unaffected},
}

// variants are the flavor and compression combinations every row runs
// under.
var variants = []struct {
	name     string
	flavor   core.Flavor
	compress Compression
}{
	{"discord-json", core.Discord, NoCompression},
	{"discord-zlib", core.Discord, ZlibStream},
	{"discord-zstd", core.Discord, ZstdStream},
	{"fluxer-json", core.Fluxer, NoCompression},
	{"fluxer-zstd", core.Fluxer, ZstdStream},
}

// TestFaultMatrix drives core + gateway + simulator through every fault,
// for both flavors and every compression, and checks the state path, how
// the shard came back, the reconnect count, and that the dispatches the
// sink saw run without gap or duplicate and end where the simulator's
// session ends. Shard 1 runs beside shard 0 and must not notice.
func TestFaultMatrix(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for _, row := range matrix {
				t.Run(row.name, func(t *testing.T) {
					want := row.discord
					if v.flavor == core.Fluxer {
						want = row.fluxer
					}
					runMatrixRow(t, v.flavor, v.compress, row, want)
				})
			}
		})
	}
}

func runMatrixRow(t *testing.T, flavor core.Flavor, compress Compression, row matrixRow, want outcome) {
	ec := envConfig{flavor: flavor, compress: compress, shards: 2}
	if row.stall {
		ec.sim.HeartbeatInterval = 10 * time.Second
		ec.shards = 1 // a bystander's heartbeats would race the stalled ones
	}
	e := newEnv(t, ec)
	e.start()
	e.publish(0, 3)
	e.synced(0)
	if want == resumesAtOnce {
		// A reconnect at once is honoured from a shard READY for a while.
		e.clk.Advance(core.ImmediateAfter)
		e.waitAcked()
	}

	stats0, accepted := e.sim.Stats(0), e.sim.Accepted()
	diag0 := e.diag(0)
	m := e.mark(0)
	var bystander core.Diag
	var bystanderStats gatewaysim.ShardStats
	if ec.shards > 1 {
		bystander, bystanderStats = e.diag(1), e.sim.Stats(1)
	}

	if n := e.sim.Inject(0, row.fault); n != 1 {
		t.Fatalf("Inject(0, %v) = %d; want 1 connection", row.fault, n)
	}
	if row.stall {
		// Hello came at 0 and the first heartbeat is due at 5 s (jitter
		// 0.5); it goes unanswered, and at 15 s the next one finds no ACK.
		e.clk.Advance(5 * time.Second)
		e.simWait("the first heartbeat", func() bool { return e.sim.Stats(0).Heartbeats > stats0.Heartbeats })
		e.clk.Advance(10 * time.Second)
		e.sim.ClearFaults(0)
	}

	switch want {
	case resumes, identifies, resumeRefused:
		e.waitBackoff(0, m)
		// Let the simulator see the connection go before time moves on,
		// as it would long before a real 5 s backoff ran out.
		e.simWait("the old connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
		e.publish(0, 3) // missed while disconnected
		e.clk.Advance(5 * time.Second)
		if want == resumes {
			e.waitEvent(0, m, "resumed")
		} else {
			e.waitEvent(0, m, "ready")
		}
	case resumesAtOnce:
		e.waitEvent(0, m, "resumed")
		e.publish(0, 3)
	case identifiesOnSocket:
		e.waitEvent(0, m, "invalidated")
		e.waitEvent(0, m, "ready")
		e.publish(0, 3)
	case fatal:
		e.waitEvent(0, m, "fatal")
		before := e.diag(0)
		e.clk.Advance(time.Minute)
		if d := e.diag(0); d.State != core.Fatal || d.Identifies+d.Resumes != before.Identifies+before.Resumes {
			t.Errorf("after a minute in FATAL: state %v, %d connection attempts; want FATAL and %d", d.State, d.Identifies+d.Resumes, before.Identifies+before.Resumes)
		}
	case unaffected:
		e.publish(0, 3) // queued behind the fault, so synced means it was read
	}
	if want != fatal {
		e.synced(0)
	}

	wantPath, wantReconnects, wantIdentifies, wantResumes, wantSessions := want.want()
	if got := append([]string{"READY"}, e.path(0, m)...); !slices.Equal(got, wantPath) {
		t.Errorf("state path = %v; want %v\nevents:\n%s", got, wantPath, logText(e.events(0), 0))
	}
	d := e.diag(0)
	if got := int64(d.Reconnects - diag0.Reconnects); got != wantReconnects {
		t.Errorf("reconnects += %d; want %d", got, wantReconnects)
	}
	st := e.sim.Stats(0)
	if got := st.Identifies - stats0.Identifies; got != wantIdentifies {
		t.Errorf("simulator identifies += %d; want %d", got, wantIdentifies)
	}
	if got := st.Resumes - stats0.Resumes; got != wantResumes {
		t.Errorf("simulator resumes += %d; want %d", got, wantResumes)
	}
	if want == identifiesOnSocket {
		if got := e.sim.Accepted(); got != accepted {
			t.Errorf("connections accepted %d -> %d; want the same socket", accepted, got)
		}
	}
	if want == resumes || want == resumesAtOnce {
		if d.Epoch != diag0.Epoch {
			t.Errorf("epoch %d -> %d across a resume; want unchanged", diag0.Epoch, d.Epoch)
		}
		if st.ReplayedEvents-stats0.ReplayedEvents < 3 && want == resumes {
			t.Errorf("replayed %d events; want the 3 published while disconnected", st.ReplayedEvents-stats0.ReplayedEvents)
		}
	}
	if st.MaxLiveSessions > 1 {
		t.Errorf("MaxLiveSessions = %d; want no duplicate session", st.MaxLiveSessions)
	}
	wantMisses := uint64(0)
	if row.fault.Kind == gatewaysim.FaultStopAcks || row.fault.Kind == gatewaysim.FaultDelay {
		wantMisses = 1 // the one that made the connection a zombie
	}
	if got := d.HeartbeatMissesTotal - diag0.HeartbeatMissesTotal; got != wantMisses || d.HeartbeatMisses != 0 {
		t.Errorf("heartbeat misses += %d, %d on the new connection; want %d and 0", got, d.HeartbeatMisses, wantMisses)
	}
	sessions, last := e.sink.checkContiguous(t, 0)
	if sessions != wantSessions {
		t.Errorf("sink saw %d sessions; want %d", sessions, wantSessions)
	}
	if want != fatal {
		if live := e.liveSeq(0); last != live {
			t.Errorf("sink ends at sequence %d; simulator's session at %d", last, live)
		}
		// The reader tells the core about a dispatch right after the sink
		// returns, so the core may trail the sink by the latest one.
		if d.State != core.Ready || d.Sequence < last-1 || d.Sequence > last {
			t.Errorf("core: state %v sequence %d; want READY at %d", d.State, d.Sequence, last)
		}
	}
	if row.fault.Kind == gatewaysim.FaultHeartbeatRequest {
		e.simWait("the requested heartbeat", func() bool { return e.sim.Stats(0).Heartbeats > stats0.Heartbeats })
	}
	if ec.shards > 1 && row.fault.Kind == gatewaysim.FaultClose && row.fault.Code == 4004 {
		// A refused token is the bot's, not the shard's (issue 22, item
		// 11): the bystander goes FATAL with it, spending nothing. The
		// sweep runs after shard 0's own fatal line, outside its lock.
		e.waitEvent(1, 0, "fatal")
		b := e.diag(1)
		bs := e.sim.Stats(1)
		if b.State != core.Fatal || b.LastCode != 4004 || bs.Identifies != bystanderStats.Identifies || bs.Resumes != bystanderStats.Resumes {
			t.Errorf("bystander shard 1 after shard 0's 4004: %v code %d, identifies %d, resumes %d; want FATAL 4004 and no session started", b.State, b.LastCode, bs.Identifies, bs.Resumes)
		}
	} else if ec.shards > 1 {
		b := e.diag(1)
		bs := e.sim.Stats(1)
		if b.State != core.Ready || b.Reconnects != bystander.Reconnects || b.Epoch != bystander.Epoch ||
			bs.Identifies != bystanderStats.Identifies || bs.Resumes != bystanderStats.Resumes {
			t.Errorf("bystander shard 1 changed: %+v -> %+v", bystander, b)
		}
	}
}

// alwaysGrant is a pacer that lets every identify through at once, as a
// misconfigured shared budget would.
type alwaysGrant struct{}

func (alwaysGrant) Request(int, bool, func()) (bool, func()) { return true, func() {} }
func (alwaysGrant) BudgetWait(bool) time.Time                { return time.Time{} }

// TestFaultMatrixStartup holds the rows of the matrix whose fault comes
// before the first READY: an identify (or discovery) refused for its
// token, and an identify refused for its rate.
func TestFaultMatrixStartup(t *testing.T) {
	for _, f := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(f.String()+"/bad-token-at-identify", func(t *testing.T) {
			e := newEnv(t, envConfig{flavor: f, sim: gatewaysim.Config{Token: "another-token"}, tr: func(c *Config, sim *gatewaysim.Server) {
				c.GatewayURL = sim.GatewayURL()
			}})
			e.node.Start()
			e.waitEvent(0, 0, "fatal")
			d := e.diag(0)
			if d.State != core.Fatal || d.LastCode != 4004 || d.Reconnects != 0 {
				t.Errorf("Diag = state %v code %d reconnects %d; want FATAL after 4004, no reconnect", d.State, d.LastCode, d.Reconnects)
			}
			if st := e.sim.Stats(0); st.Identifies != 0 {
				t.Errorf("simulator identifies = %d; want 0", st.Identifies)
			}
		})
		t.Run(f.String()+"/bad-token-at-discovery", func(t *testing.T) {
			e := newEnv(t, envConfig{flavor: f, sim: gatewaysim.Config{Token: "another-token"}, noDiscover: true})
			e.node.Start()
			e.waitEvent(0, 0, "fatal")
			if d := e.diag(0); d.State != core.Fatal || !errors.Is(d.LastError, ErrUnauthorized) || e.sim.Accepted() != 0 {
				t.Errorf("Diag = state %v error %v, %d connections; want FATAL, ErrUnauthorized, none", d.State, d.LastError, e.sim.Accepted())
			}
		})
	}

	t.Run("discord/rate-limited", func(t *testing.T) {
		// Two shards of one bucket identify together: Discord answers the
		// second with op 9 false, a new session after the backoff.
		e := newEnv(t, envConfig{shards: 2, pacer: alwaysGrant{}, sim: gatewaysim.Config{MaxConcurrency: 1}})
		e.node.Start()
		e.simWait("one identify refused", func() bool { return e.sim.Totals().RefusedIdentifies == 1 })
		refused := 0
		if e.sim.Stats(1).RefusedIdentifies == 1 {
			refused = 1
		}
		e.waitBackoff(refused, 0)
		e.clk.Advance(5 * time.Second)
		e.waitEvent(refused, 0, "ready")
		e.waitEvent(1-refused, 0, "ready")
		if got, want := e.path(refused, 0), []string{"BACKOFF", "STARTING", "READY"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("refused shard's path = %v; want %v", got, want)
		}
	})

	t.Run("fluxer/identify-budget", func(t *testing.T) {
		// Fluxer drops an identify over its budget without an answer: the
		// READY timeout notices, and the retry after the window succeeds.
		e := newEnv(t, envConfig{flavor: core.Fluxer, shards: 2, sim: gatewaysim.Config{IdentifyBudget: 1}})
		e.node.Start()
		e.simWait("one identify dropped", func() bool { return e.sim.Totals().RefusedIdentifies == 1 })
		refused := 0
		if e.sim.Stats(1).RefusedIdentifies == 1 {
			refused = 1
		}
		e.waitEvent(1-refused, 0, "ready") // before its READY timeout can run
		e.clk.Advance(time.Minute)
		off := e.waitBackoff(refused, 0)
		if line := logText(e.events(refused), 0)[:off]; !strings.Contains(line, "no READY within 1m0s") {
			t.Errorf("backoff line %q; want the READY timeout", line)
		}
		e.clk.Advance(5 * time.Second)
		e.waitEvent(refused, 0, "ready")
	})
}
