package core_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// Rule: per-shard isolation. A failure and a reset of shard 1 leave every
// other shard's context exactly as it was.
func TestRuleIsolationFailureTouchesOneShard(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	before := e.node.Snapshot(nil)
	e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.clk.Advance(5 * time.Second)
	e.exec(1, "reset")
	after := e.node.Snapshot(nil)
	for i, d := range after {
		if d.Shard == 1 {
			continue
		}
		if !reflect.DeepEqual(d, before[i]) {
			t.Errorf("shard %d changed after shard 1 failed:\nbefore %+v\nafter  %+v", d.Shard, before[i], d)
		}
	}
	if after[1].Reconnects != 2 {
		t.Errorf("shard 1 reconnects = %d; want 2", after[1].Reconnects)
	}
}

// Rule: a panic in one shard's goroutine is recovered, logged with its
// stack to that shard's events and handled like a transport failure.
func TestRuleIsolationPanicIsATransientFailure(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	l := e.conn(2).Link
	func() {
		defer l.Recover()
		var m map[string]int
		m["boom"]++ // a nil-map write: a real runtime panic
	}()
	e.wantState(2, core.Backoff)
	ev := e.events(2)
	if !strings.Contains(ev, "event=panic") || !strings.Contains(ev, "rules_test.go") {
		t.Fatalf("shard 2 events lack the panic and its stack:\n%s", ev)
	}
	if d := e.diag(2); d.Reconnects != 1 || !strings.Contains(d.LastError.Error(), "panic") {
		t.Fatalf("shard 2 after panic: reconnects %d, error %v; want 1 and a panic error", d.Reconnects, d.LastError)
	}
	for _, id := range []int{0, 1, 3} {
		e.wantState(id, core.Ready)
		if strings.Contains(e.events(id), "panic") {
			t.Fatalf("shard %d events mention the panic of shard 2", id)
		}
	}
}

// Rule: entering backoff sets BACKOFF, counts the reconnect, computes the
// deadline, then logs the error and the TCP, TLS and WebSocket states
// before the reset wipes them.
func TestRuleBackoffEntryLogsBeforeReset(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	l := e.conn(0).Link
	l.Transport(core.ConnState{TCP: core.LayerFailed, TLS: core.LayerOK, WS: core.LayerClosed})
	l.Fail(core.Failure{Class: core.Transient, Err: errDrop, Code: 1006})

	d := e.diag(0)
	if d.State != core.Backoff || d.Reconnects != 1 || !d.Waiting || d.RetryDelay != 5*time.Second {
		t.Fatalf("after failure: %v reconnects=%d waiting=%v retry=%v; want BACKOFF 1 true 5s", d.State, d.Reconnects, d.Waiting, d.RetryDelay)
	}
	want := `event=backoff state=BACKOFF reconnects=1 err="connection reset by peer" code=1006 tcp=failed tls=ok ws=closed retry_ms=5000`
	if got := e.lastEvent(0); !strings.Contains(got, want) {
		t.Fatalf("backoff event = %q; want it to contain %q", got, want)
	}
	if !errors.Is(d.LastError, errDrop) || d.Conn.TCP != core.LayerFailed {
		t.Fatalf("during BACKOFF diag lost the error state: %+v", d)
	}
	e.clk.Advance(5 * time.Second)
	d = e.diag(0)
	if d.LastError != nil || d.Conn != (core.ConnState{}) || d.LastCode != 0 {
		t.Fatalf("after reset the error state survived: err=%v conn=%+v code=%d", d.LastError, d.Conn, d.LastCode)
	}
	if !strings.Contains(e.events(0), want) {
		t.Fatal("the reset removed the backoff line from the events log")
	}
}

// Rule: a zero reconnect deadline means "schedule the normal backoff now";
// a deadline of now reconnects at once, once the shard has been READY for
// core.ImmediateAfter, and gets the policy's delay sooner (an op 7 storm).
func TestRuleZeroDeadlineMeansPolicy(t *testing.T) {
	e := newEnv(t, core.Config{Backoff: core.Fixed(7 * time.Second)})
	e.startAll()
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	if d := e.diag(0); d.RetryDelay != 7*time.Second {
		t.Fatalf("zero deadline: retry in %v; want the policy's 7s", d.RetryDelay)
	}
	e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop, Deadline: e.clk.Now().Add(2 * time.Second)})
	if d := e.diag(1); d.RetryDelay != 2*time.Second {
		t.Fatalf("explicit deadline: retry in %v; want 2s", d.RetryDelay)
	}
	e.conn(3).Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("op 7"), Deadline: e.clk.Now()})
	if d := e.diag(3); d.State != core.Backoff || d.RetryDelay != 7*time.Second {
		t.Fatalf("deadline now, READY for 0s: %v, retry in %v; want BACKOFF for the policy's 7s", d.State, d.RetryDelay)
	}
	e.clk.Advance(core.ImmediateAfter)
	e.conn(2).Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("op 7"), Deadline: e.clk.Now()})
	if d := e.diag(2); d.State != core.Starting || d.Reconnects != 1 {
		t.Fatalf("deadline now after %v READY: %v after %d reconnects; want STARTING after 1", core.ImmediateAfter, d.State, d.Reconnects)
	}
}

// Rule: the reset wipes the shard's transport state only: connection, send
// queue, heartbeat state, error state, reconnect deadline.
func TestRuleResetScope(t *testing.T) {
	e := newEnv(t, core.Config{Send: core.SendPolicy{Limit: 2, Reserve: 1, Window: time.Minute, Queue: 8}})
	e.startAll()
	old := e.conn(0)
	old.Link.Heartbeat(40 * time.Millisecond)
	old.Link.Dispatch(9)
	for range 3 {
		if err := e.node.Send(0, []byte(`{"op":3,"d":{}}`)); err != nil {
			t.Fatal(err)
		}
	}
	before := e.diag(0)
	if before.SendQueued != 2 || before.Latency != 40*time.Millisecond {
		t.Fatalf("before reset: queued %d latency %v; want 2 and 40ms", before.SendQueued, before.Latency)
	}
	e.exec(0, "reset")
	after := e.diag(0)
	if got := old.Closed(); len(got) != 1 || got[0] != 4000 {
		t.Errorf("old connection closed with %v; want [4000]", got)
	}
	if e.conn(0) == old {
		t.Error("no new connection after reset")
	}
	if after.SendQueued != 0 || after.Latency != 0 || after.LastError != nil || after.Waiting {
		t.Errorf("transport state survived the reset: %+v", after)
	}
	if after.Epoch != before.Epoch || after.Session != "resumable" || after.Reconnects != 1 || after.Identifies != before.Identifies {
		t.Errorf("reset touched more than transport state: before %+v after %+v", before, after)
	}
	// The queued commands died with the old connection: the new one sends
	// nothing.
	e.conn(0).Link.Resumed(9)
	e.clk.Advance(2 * time.Minute)
	if n := len(e.conn(0).Sent()); n != 0 {
		t.Errorf("new connection sent %d queued commands; the reset should have dropped them", n)
	}
}

// Rule: after a reset the sequence is restored only when a session exists,
// is valid and the saved sequence was valid; otherwise it is none and the
// shard identifies.
func TestRuleResumeRule(t *testing.T) {
	for _, tc := range []struct {
		name       string
		setup      func(e *env)
		wantResume bool
		wantSeq    int64
	}{
		{"valid session and sequence", func(e *env) {
			e.ready(0, 1)
			e.conn(0).Link.Dispatch(41)
			e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		}, true, 41},
		{"no session yet", func(e *env) {
			e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		}, false, 0},
		{"session invalidated", func(e *env) {
			e.ready(0, 1)
			e.conn(0).Link.Dispatch(41)
			e.conn(0).Link.Fail(core.Failure{Class: core.NewSession, Err: errors.New("op 9 false"), Code: 4009})
		}, false, 0},
		{"identify command", func(e *env) {
			e.ready(0, 1)
			e.conn(0).Link.Dispatch(41)
			e.exec(0, "identify")
		}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, core.Config{})
			e.node.Start()
			tc.setup(e)
			e.clk.Advance(5 * time.Second)
			a := e.conn(0).Attempt
			d := e.diag(0)
			if a.Resume != tc.wantResume {
				t.Fatalf("attempt resume = %v; want %v", a.Resume, tc.wantResume)
			}
			if tc.wantResume && (a.Sequence != tc.wantSeq || d.Sequence != tc.wantSeq || !d.SequenceValid) {
				t.Fatalf("resume at %d, diag sequence %d valid=%v; want %d", a.Sequence, d.Sequence, d.SequenceValid, tc.wantSeq)
			}
			if !tc.wantResume && d.SequenceValid {
				t.Fatalf("identify with sequence %d; want none", d.Sequence)
			}
		})
	}
}

// Rule: after a reset the new connection is bound first, then the retry
// is logged.
func TestRuleRebindBeforeRetryLog(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	events, _ := e.node.ShardEvents(0)
	atConnect := int64(-1)
	e.tr.Probe = func(core.Attempt) { atConnect = events.Size() }
	e.clk.Advance(5 * time.Second)
	if atConnect < 0 {
		t.Fatal("no new connection at the deadline")
	}
	logged := e.events(0)
	if strings.Contains(logged[:atConnect], "event=retry") {
		t.Fatalf("the retry was logged before the new connection was bound:\n%s", logged)
	}
	if added := logged[atConnect:]; !strings.Contains(added, "event=retry state=STARTING mode=resume") {
		t.Fatalf("after the rebind the log gained %q; want a retry line with mode=resume", added)
	}
}

// Rule: the lease tick. Already expired: nothing; deadline zero: enforcement
// off; now at or past the deadline: stop the shard's traffic.
func TestRuleLeaseGating(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.exec(-1, "lease 10s")
	gen := e.diag(0).Lease.Generation
	if gen != 1 {
		t.Fatalf("first lease generation = %d; want 1", gen)
	}
	e.clk.Advance(9 * time.Second)
	e.wantState(0, core.Ready)
	e.exec(-1, "lease 10s") // renewal: same generation
	e.clk.Advance(9 * time.Second)
	e.wantState(0, core.Ready)
	if g := e.diag(0).Lease.Generation; g != 1 {
		t.Fatalf("renewed lease generation = %d; want 1", g)
	}
	e.exec(3, "stop")
	conn0 := e.conn(0)
	e.clk.Advance(time.Second)
	for id := range 3 {
		d := e.diag(id)
		if d.State != core.Stopped || d.StopReason != core.StoppedByLease || !d.LeaseExpired {
			t.Fatalf("shard %d after expiry: %v (%v) expired=%v; want STOPPED (lease expired)", id, d.State, d.StopReason, d.LeaseExpired)
		}
	}
	if got := conn0.Closed(); len(got) != 1 || got[0] != 4000 {
		t.Fatalf("expiry closed the connection with %v; want [4000] so the session survives", got)
	}
	if err := e.node.ExecShard(0, "start"); !errors.Is(err, core.ErrBusy) {
		t.Fatalf("start with an expired lease = %v; want ErrBusy", err)
	}
	// Already expired: a second tick changes nothing.
	n := len(e.tr.Conns())
	e.clk.Advance(time.Minute)
	if len(e.tr.Conns()) != n {
		t.Fatal("an expired lease let a shard connect")
	}
	e.exec(-1, "lease 10s")
	if g := e.diag(0).Lease.Generation; g != 2 {
		t.Fatalf("lease armed after expiry: generation %d; want 2", g)
	}
	for id := range 3 {
		e.wantState(id, core.Starting)
		if a := e.conn(id).Attempt; !a.Resume || a.LeaseGeneration != 2 {
			t.Fatalf("shard %d restarted with %+v; want a resume under generation 2", id, a)
		}
	}
	e.wantState(3, core.Stopped) // stopped by the operator: stays stopped
	e.exec(-1, "lease off")
	e.clk.Advance(time.Hour)
	e.wantState(0, core.Starting)
	if d := e.diag(0); !d.Lease.Deadline.IsZero() {
		t.Fatalf("lease off left deadline %v", d.Lease.Deadline)
	}
}

// The default policy doubles from 5 s to 10 min with ±50% jitter, and the
// failure count starts again after 60 s in READY. The first failure of a
// resumable session retries within 100 ms.
func TestRuleBackoffPolicy(t *testing.T) {
	p := core.DefaultBackoff
	for _, tc := range []struct {
		failures  int
		resumable bool
		r         float64
		want      time.Duration
	}{
		{1, false, 0.5, 5 * time.Second}, {2, false, 0.5, 10 * time.Second}, {3, true, 0.5, 20 * time.Second},
		{1, false, 0, 2500 * time.Millisecond}, {1, false, 0.999999, 7499995 * time.Microsecond},
		{1, true, 0.5, 50 * time.Millisecond}, {1, true, 0, 0}, {1, true, 0.999, 99900 * time.Microsecond},
		{8, false, 0.5, 10 * time.Minute}, {40, false, 0.5, 10 * time.Minute}, {40, true, 0.999, 10 * time.Minute}, {40, false, 0, 5 * time.Minute},
	} {
		if got := p.Delay(tc.failures, tc.resumable, tc.r); got.Round(time.Microsecond) != tc.want {
			t.Errorf("Delay(%d, %v, %v) = %v; want %v", tc.failures, tc.resumable, tc.r, got, tc.want)
		}
	}
	if got := core.Fixed(5*time.Second).Delay(1, true, 0.9); got != 5*time.Second {
		t.Errorf("fixed:5s Delay(1, resumable) = %v; want 5s", got)
	}

	e := newEnv(t, core.Config{Backoff: core.DefaultBackoff})
	e.startAll()
	fail := func() time.Duration {
		e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		d := e.diag(0).RetryDelay
		e.clk.Advance(d)
		return d
	}
	if a, b, c := fail(), fail(), fail(); a != 50*time.Millisecond || b != 10*time.Second || c != 20*time.Second {
		t.Fatalf("consecutive delays %v %v %v; want 50ms (first resume) 10s 20s", a, b, c)
	}
	e.conn(0).Link.Resumed(1)
	e.clk.Advance(59 * time.Second)
	if d := fail(); d != 40*time.Second {
		t.Fatalf("after 59 s READY the delay is %v; want 40s (count kept)", d)
	}
	e.conn(0).Link.Resumed(1)
	e.clk.Advance(60 * time.Second)
	if d := fail(); d != 50*time.Millisecond {
		t.Fatalf("after 60 s READY the delay is %v; want 50ms (count reset, resumable)", d)
	}
	fail() // 10 s: the count goes on
	// An operator's identify, start or retry starts the count again: a
	// failure after it waits the first step.
	for _, cmd := range []string{"identify", "stop", "start"} {
		before := e.tr.Last(0)
		e.exec(0, cmd)
		if cmd == "stop" {
			continue
		}
		e.clk.Advance(core.DiscordWindow) // the identify slot
		if e.tr.Last(0) == before {
			t.Fatalf("the operator's %s opened no connection", cmd)
		}
		e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
		if d := e.diag(0).RetryDelay; d != 5*time.Second {
			t.Fatalf("a failure after the operator's %s waits %v; want 5s (first step, no session)", cmd, d)
		}
	}
}

func TestParseBackoff(t *testing.T) {
	for in, want := range map[string]core.BackoffPolicy{"": core.DefaultBackoff, "default": core.DefaultBackoff, "fixed:5s": core.Fixed(5 * time.Second)} {
		got, err := core.ParseBackoff(in)
		if err != nil || got != want {
			t.Errorf("ParseBackoff(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"fixed:", "fixed:-1s", "fixed:0s", "fixed:2h", "linear", "fixed:5"} {
		if _, err := core.ParseBackoff(in); !errors.Is(err, core.ErrUsage) || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseBackoff(%q) = %v; want ErrUsage naming the input", in, err)
		}
	}
}

// Rule: the session epoch is 0 until the first new session, grows at every
// new session and is unchanged by a resume.
func TestRuleSessionEpoch(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.node.Start()
	if ep := e.diag(0).Epoch; ep != 0 {
		t.Fatalf("epoch before any session = %d; want 0", ep)
	}
	e.ready(0, 1)
	first := e.diag(0).Epoch
	if first == 0 {
		t.Fatal("epoch stayed 0 after a new session")
	}
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.clk.Advance(5 * time.Second)
	e.conn(0).Link.Resumed(1)
	if ep := e.diag(0).Epoch; ep != first {
		t.Fatalf("epoch after resume = %d; want unchanged %d", ep, first)
	}
	e.exec(0, "identify")
	e.ready(0, 1)
	if ep := e.diag(0).Epoch; ep <= first {
		t.Fatalf("epoch after a new session = %d; want more than %d", ep, first)
	}
	if !strings.Contains(e.events(0), fmt.Sprintf("event=ready epoch=%d", first)) {
		t.Fatalf("events do not show the epoch:\n%s", e.events(0))
	}
}

// Rule: the recovery diagnostic. attempt is one running 1-based count for
// the shard's whole run, and during a retry delay it names the attempt that
// ended; the phase is recovery for every attempt after a READY session, op
// 9 included; retry_delay_ms is the scheduled wait, not a countdown, and
// reconnect_deadline when it ends.
func TestRuleRecoveryDiagnostic(t *testing.T) {
	e := newEnv(t, core.Config{})
	if d := e.diag(0); d.Attempt != 0 {
		t.Fatalf("ASSIGNED: attempt %d; want 0 before the start", d.Attempt)
	}
	e.node.Start()
	at := func(d time.Duration) string { return e.clk.Now().Add(d).UTC().Format(time.RFC3339Nano) }
	check := func(step string, attempt int, phase, delay, deadline string) {
		t.Helper()
		d := e.diag(0)
		text := string(d.AppendText(nil, e.clk.Now()))
		kv := map[string]string{}
		for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
			k, v, _ := strings.Cut(l, " ")
			kv[k] = v
		}
		want := map[string]string{"attempt": fmt.Sprint(attempt), "recovery_phase": phase, "retry_delay_ms": delay, "reconnect_deadline": deadline}
		for k, w := range want {
			if kv[k] != w {
				t.Errorf("%s: %s %q; want %q\n%s", step, k, kv[k], w, text)
			}
		}
		if d.Attempt != attempt || d.Recovery != (phase == "recovery") {
			t.Errorf("%s: Diag attempt %d recovery %v; want %d %s", step, d.Attempt, d.Recovery, attempt, phase)
		}
	}
	check("first connect", 1, "startup", "none", "none")
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	check("startup failure", 1, "startup", "5000", at(5*time.Second))
	e.clk.Advance(2 * time.Second)
	if d := e.diag(0); !strings.Contains(string(d.AppendText(nil, e.clk.Now())), "state BACKOFF\nstate_age_ms 2000\n") {
		t.Fatalf("diag lacks the age of the BACKOFF state:\n%s", d.AppendText(nil, e.clk.Now()))
	}
	check("2 s into the wait", 1, "startup", "5000", at(3*time.Second))
	e.clk.Advance(3 * time.Second)
	check("second startup attempt", 2, "startup", "none", "none")
	e.ready(0, 1)
	check("READY", 2, "startup", "none", "none")
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	check("failure after READY", 2, "recovery", "5000", at(5*time.Second))
	e.clk.Advance(5 * time.Second)
	check("first recovery attempt", 3, "recovery", "none", "none")
	e.conn(0).Link.Resumed(2)
	e.conn(0).Link.Invalidated() // op 9 on the open socket
	check("op 9 after READY", 4, "recovery", "none", "none")
	e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: 4004})
	check("FATAL", 4, "recovery", "none", "none")
	e.exec(0, "retry")
	check("retry", 5, "recovery", "none", "none")

	// op 9 ending the first session starts a recovery too.
	e.ready(1, 1)
	e.conn(1).Link.Invalidated()
	if d := e.diag(1); d.Attempt != 2 || !d.Recovery || d.Phase != core.PhaseIdentify {
		t.Errorf("op 9 ending shard 1's first session: attempt %d recovery %v phase %v; want 2 true identify", d.Attempt, d.Recovery, d.Phase)
	}
}

// The diag file shows the session epoch, the missed heartbeat ACKs of the
// current connection and of the shard's whole run, and the reconnect
// deadline, under the names DESIGN.md section 2 gives them.
func TestDiagKeys(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	l := e.conn(0).Link
	l.HeartbeatMissed()
	l.HeartbeatMissed()
	kv := func() map[string]string {
		d := e.diag(0)
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSuffix(string(d.AppendText(nil, e.clk.Now())), "\n"), "\n") {
			k, v, _ := strings.Cut(l, " ")
			m[k] = v
		}
		return m
	}
	epoch := fmt.Sprint(e.diag(0).Epoch)
	want := map[string]string{"session_epoch": epoch, "heartbeat_misses": "2", "heartbeat_misses_total": "2", "reconnect_deadline": "none"}
	got := kv()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("READY with 2 misses: %s %q; want %q", k, got[k], w)
		}
	}
	l.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	l.HeartbeatMissed() // stale: the connection is gone
	e.clk.Advance(5 * time.Second)
	e.conn(0).Link.HeartbeatMissed()
	want = map[string]string{"session_epoch": epoch, "heartbeat_misses": "1", "heartbeat_misses_total": "3"}
	got = kv()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("new connection with 1 miss: %s %q; want %q", k, got[k], w)
		}
	}
	if d := e.diag(0); d.HeartbeatMisses != 1 || d.HeartbeatMissesTotal != 3 {
		t.Errorf("Diag misses %d/%d; want 1/3", d.HeartbeatMisses, d.HeartbeatMissesTotal)
	}
}

// Rule: Discord identify slots: bucket = shard % max_concurrency, one per
// bucket per 5 s, each bucket's requests served in order.
func TestRuleDiscordIdentifyPacing(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 2)
	var order []string
	for _, id := range []int{0, 1, 2, 3, 4, 5, 6, 7} {
		if now, _ := p.Request(id, false, func() { order = append(order, fmt.Sprintf("%d@%v", id, clk.Now().Sub(clock.Epoch))) }); now {
			order = append(order, fmt.Sprintf("%d@0s", id))
		}
	}
	if d := p.DrainTime(); d != 15*time.Second {
		t.Errorf("DrainTime() with 6 waiting in 2 buckets = %v; want 15s", d)
	}
	clk.Advance(time.Minute)
	want := "0@0s 1@0s 2@5s 3@5s 4@10s 5@10s 6@15s 7@15s"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("grants %s; want %s", got, want)
	}
	if d := p.DrainTime(); d != 0 {
		t.Errorf("DrainTime() with nothing waiting = %v; want 0", d)
	}
}

// session_start_limit: no automatic identify while remaining is down to
// the reserve (10 of 1,000), until reset_after.
func TestDiscordPacerStartLimit(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	p.SetStartLimit(core.StartLimit{Total: 1000, Remaining: 11, ResetAfter: time.Hour, MaxConcurrency: 1})
	if now, _ := p.Request(0, false, func() {}); !now {
		t.Fatal("first identify with remaining 11 waited")
	}
	granted := false
	if now, _ := p.Request(1, false, func() { granted = true }); now {
		t.Fatal("identify with remaining 10, the reserve, granted at once")
	}
	clk.Advance(59 * time.Minute)
	if granted {
		t.Fatal("identify granted before reset_after")
	}
	if n, next := p.Waiting(); n != 1 || !next.Equal(clock.Epoch.Add(time.Hour)) {
		t.Fatalf("Waiting() = %d, %v; want 1, %v", n, next, clock.Epoch.Add(time.Hour))
	}
	clk.Advance(time.Minute)
	if !granted {
		t.Fatal("identify not granted after reset_after")
	}
}

// A changed max_concurrency re-buckets waiting requests in their order.
func TestDiscordPacerRebuckets(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	var order []string
	for id := range 6 {
		if now, _ := p.Request(id, false, func() { order = append(order, fmt.Sprintf("%d@%v", id, clk.Now().Sub(clock.Epoch))) }); now {
			order = append(order, fmt.Sprintf("%d@0s", id))
		}
	}
	p.SetStartLimit(core.StartLimit{MaxConcurrency: 3})
	clk.Advance(time.Minute)
	// Shard 0 used bucket 0 at 0s; after re-bucketing, 1 and 2 find their
	// new buckets free, and bucket 0 frees at 5s.
	want := "0@0s 1@0s 2@0s 3@5s 4@5s 5@5s"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("grants %s; want %s", got, want)
	}
}

// Fluxer: at most Budget identifies per Window, Spacing apart.
func TestRuleFluxerIdentifyPacing(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewFluxerPacer(clk, core.FluxerPacing{Budget: 3, Window: 10 * time.Second, Spacing: time.Second})
	var times []time.Duration
	for id := range 7 {
		if now, _ := p.Request(id, false, func() { times = append(times, clk.Now().Sub(clock.Epoch)) }); now {
			times = append(times, 0)
		}
	}
	clk.Advance(time.Minute)
	want := []time.Duration{0, time.Second, 2 * time.Second, 10 * time.Second, 11 * time.Second, 12 * time.Second, 20 * time.Second}
	if !reflect.DeepEqual(times, want) {
		t.Fatalf("grant times %v; want %v", times, want)
	}
}

// A cancelled request gives its place up.
func TestPacerCancel(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	p.Request(0, false, func() {})
	var got []int
	_, cancel1 := p.Request(1, false, func() { got = append(got, 1) })
	p.Request(2, false, func() { got = append(got, 2) })
	cancel1()
	clk.Advance(time.Minute)
	if !reflect.DeepEqual(got, []int{2}) {
		t.Fatalf("grants %v; want [2]", got)
	}
}

// Rule: a resume never waits for an identify slot, even when every slot
// is taken.
func TestRuleResumeNeverWaitsForSlot(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(2, 0, 1)}, maxConcurrency(1))
	e.node.Start()
	e.ready(0, 1)
	e.clk.Advance(5 * time.Second)
	e.ready(1, 1)
	// Both shards fail at once; the bucket's last identify was just now.
	e.exec(-1, "reset all")
	for id := range 2 {
		d := e.diag(id)
		if d.State != core.Starting || d.Phase != core.PhaseDial || !e.conn(id).Attempt.Resume {
			t.Fatalf("shard %d after reset: %v %v resume=%v; want STARTING dial resume=true", id, d.State, d.Phase, e.conn(id).Attempt.Resume)
		}
	}
}
