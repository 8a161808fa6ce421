package core_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
)

// syncBuffer is a bytes.Buffer safe for the loggers of concurrent shards.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func (w *syncBuffer) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Len()
}

const (
	fluxerGateway = "wss://gateway.fluxer.example/"
	restoredID    = "r3st0red-session-id"
)

// storeEnv is a node on a fake clock with an in-memory session store, its
// slog output kept so that tests can check levels.
type storeEnv struct {
	*env
	store *coretest.Store
	log   *syncBuffer
}

func newStoreEnv(t *testing.T, cfg core.Config, store *coretest.Store, opts ...maxConcurrency) *storeEnv {
	t.Helper()
	if store == nil {
		store = &coretest.Store{}
	}
	out := &syncBuffer{}
	cfg.Sessions = store
	cfg.Logger = slog.New(slog.NewTextHandler(out, nil))
	if cfg.StoreTimeout == 0 {
		// The deadline of a store call is real time; tests that want
		// one to pass set it short.
		cfg.StoreTimeout = time.Minute
	}
	return &storeEnv{env: newEnv(t, cfg, opts...), store: store, log: out}
}

// snapAt is a resumable snapshot of the fake clock's epoch minus age.
func snapAt(f core.Flavor, age time.Duration) core.Snapshot {
	url := "wss://resume.discord.example"
	if f == core.Fluxer {
		url = fluxerGateway
	}
	return core.Snapshot{
		Flavor: f, Session: core.Session{ID: restoredID, ResumeURL: url},
		Sequence: 77, Total: 4, SavedAt: clock.Epoch.Add(-age),
	}
}

// checkNoSecret fails if a session id shows anywhere a user or log sees.
func (e *storeEnv) checkNoSecret(t *testing.T) {
	t.Helper()
	all := readLog(e.node.Events()) + e.log.String()
	for _, id := range e.node.Plan().Local {
		d := e.diag(id)
		all += string(d.AppendText(nil, e.clk.Now())) + fmt.Sprintf("%v %+v %#v", d, d, d)
	}
	for _, secret := range []string{restoredID, secretSession} {
		if strings.Contains(all, secret) {
			t.Fatalf("a session id appears in the events, logs or diag:\n%s", all)
		}
	}
}

// storeBound is the store timeout of the rows that test it. The bound
// is real time and covers every shard's load, the fast ones too: on a
// loaded machine a goroutine can wait tens of milliseconds to run, so a
// 20 ms bound failed the other shards' in-memory loads (flake hunt).
const storeBound = time.Second

// Rule (DESIGN 7.1): a snapshot is resumed only when it is fresh, unused,
// of this flavor, total and (Fluxer) gateway, and once its stored copy is
// marked used; any other snapshot, and any store failure, is one line in
// the shard's events and a new session, and nothing else changes.
func TestSnapshotLoadRules(t *testing.T) {
	const victim = 1
	blockSave := func(ctx context.Context, shard int, snap core.Snapshot) error {
		if shard == victim && snap.Used() {
			return coretest.Block(ctx)
		}
		return nil
	}
	// late holds a store that ignores its deadline until the test ends: a
	// sleep past the deadline could end first on a loaded machine, and
	// storeCall would then take the answer.
	late := make(chan struct{})
	t.Cleanup(func() { close(late) })
	for _, tc := range []struct {
		name    string
		flavor  core.Flavor
		gateway string
		window  time.Duration
		snap    *core.Snapshot // nil: none stored
		onLoad  func(ctx context.Context, shard int) error
		onSave  func(ctx context.Context, shard int, snap core.Snapshot) error
		timeout time.Duration
		// What must happen: resume, or a new session with an events
		// line holding want (at level, in slog's words).
		resume bool
		want   string
		level  string
	}{
		{name: "fresh discord", snap: ptr(snapAt(core.Discord, 10*time.Second)), resume: true, want: "event=snapshot-loaded age_ms=10000 sequence=77", level: "INFO"},
		{name: "discord at the window", snap: ptr(snapAt(core.Discord, 120*time.Second)), resume: true, want: "event=snapshot-loaded age_ms=120000"},
		{name: "discord past the window", snap: ptr(snapAt(core.Discord, 120*time.Second+time.Millisecond)),
			want: `event=snapshot-ignored reason="older than the resume window (age 2m0.001s, window 2m0s)"`, level: "WARN"},
		{name: "fluxer past its window", flavor: core.Fluxer, gateway: fluxerGateway, snap: ptr(snapAt(core.Fluxer, 61*time.Second)),
			want: `reason="older than the resume window (age 1m1s, window 1m0s)"`},
		{name: "fluxer within its window", flavor: core.Fluxer, gateway: fluxerGateway, snap: ptr(snapAt(core.Fluxer, 59*time.Second)), resume: true, want: "event=snapshot-loaded age_ms=59000"},
		{name: "configured window", window: 10 * time.Second, snap: ptr(snapAt(core.Discord, 11*time.Second)), want: `reason="older than the resume window (age 11s, window 10s)"`},
		{name: "used", snap: ptr(func() core.Snapshot { s := snapAt(core.Discord, time.Second); s.Session.ID = ""; return s }()), want: "event=snapshot-ignored reason=used"},
		{name: "another flavor", snap: ptr(snapAt(core.Fluxer, time.Second)), want: `reason="another flavor (fluxer; this node is discord)"`},
		{name: "another total", snap: ptr(func() core.Snapshot { s := snapAt(core.Discord, time.Second); s.Total = 8; return s }()), want: `reason="another total (8; this plan has 4)"`},
		{name: "negative sequence", snap: ptr(func() core.Snapshot { s := snapAt(core.Discord, time.Second); s.Sequence = -1; return s }()), want: `reason="malformed (sequence -1)"`},
		// The saver's wall clock is another node's (DESIGN 7.3): a planned
		// move takes milliseconds, so any skew puts saved_at in the future.
		// Within SnapshotSkew it counts as age 0 (it once ignored 15 ms).
		{name: "saver 15ms ahead", snap: ptr(snapAt(core.Discord, -15*time.Millisecond)), resume: true, want: "event=snapshot-loaded age_ms=0 sequence=77"},
		{name: "saver 2s ahead", snap: ptr(snapAt(core.Discord, 7*time.Millisecond-2*time.Second)), resume: true, want: "event=snapshot-loaded age_ms=0 sequence=77"},
		{name: "saver 2s behind", snap: ptr(snapAt(core.Discord, 7*time.Millisecond+2*time.Second)), resume: true, want: "event=snapshot-loaded age_ms=2007 sequence=77"},
		{name: "saved in the future", snap: ptr(snapAt(core.Discord, -core.SnapshotSkew-time.Millisecond)),
			want: `reason="saved_at in the future by 5.001s, beyond the tolerated skew of 5s (a clock is wrong)"`},
		{name: "fluxer another gateway", flavor: core.Fluxer, gateway: "wss://other.fluxer.example/", snap: ptr(snapAt(core.Fluxer, time.Second)), want: `reason="another gateway"`},
		{name: "fluxer same gateway spelled otherwise", flavor: core.Fluxer, gateway: "WSS://Gateway.Fluxer.example?v=1", snap: ptr(snapAt(core.Fluxer, time.Second)), resume: true, want: "event=snapshot-loaded"},
		{name: "fluxer gateway unknown", flavor: core.Fluxer, snap: ptr(snapAt(core.Fluxer, time.Second)), want: `reason="no gateway endpoint to check it against"`},
		{name: "none stored"},
		{name: "load error", snap: ptr(snapAt(core.Discord, time.Second)),
			onLoad: func(ctx context.Context, shard int) error { return errors.New("disk on fire") },
			want:   `event=snapshot-error op=load err="disk on fire" then="new session"`, level: "ERROR"},
		{name: "load over the bound", snap: ptr(snapAt(core.Discord, time.Second)), timeout: storeBound,
			onLoad: func(ctx context.Context, shard int) error { return coretest.Block(ctx) },
			want:   `event=snapshot-error op=load err="the session store took over 1s"`, level: "ERROR"},
		{name: "load ignoring its deadline", snap: ptr(snapAt(core.Discord, time.Second)), timeout: storeBound,
			onLoad: func(ctx context.Context, shard int) error {
				<-ctx.Done()
				<-late
				return nil
			},
			want: `event=snapshot-error op=load err="the session store took over 1s"`, level: "ERROR"},
		{name: "load panics", snap: ptr(snapAt(core.Discord, time.Second)),
			onLoad: func(ctx context.Context, shard int) error { panic("store exploded") },
			want:   `event=snapshot-error op=load err="the session store panicked: store exploded"`, level: "ERROR"},
		{name: "mark used fails", snap: ptr(snapAt(core.Discord, time.Second)),
			onSave: func(ctx context.Context, shard int, snap core.Snapshot) error {
				return errors.New("read-only file system")
			},
			want: `event=snapshot-error op=mark-used err="read-only file system" then="new session"`, level: "ERROR"},
		{name: "mark used over the bound", snap: ptr(snapAt(core.Discord, time.Second)), timeout: storeBound, onSave: blockSave,
			want: `event=snapshot-error op=mark-used err="the session store took over 1s"`, level: "ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &coretest.Store{}
			if tc.onLoad != nil {
				store.OnLoad = func(ctx context.Context, shard int) error {
					if shard != victim {
						return nil
					}
					return tc.onLoad(ctx, shard)
				}
			}
			if tc.onSave != nil {
				store.OnSave = func(ctx context.Context, shard int, snap core.Snapshot) error {
					if shard != victim {
						return nil
					}
					return tc.onSave(ctx, shard, snap)
				}
			}
			if tc.snap != nil {
				store.Put(victim, *tc.snap)
			}
			e := newStoreEnv(t, core.Config{Flavor: tc.flavor, Gateway: tc.gateway, ResumeWindow: tc.window, StoreTimeout: tc.timeout}, store)
			var unmarked []int
			e.tr.Probe = func(a core.Attempt) {
				if got, _ := store.Get(a.Shard); a.Resume && !got.Used() {
					unmarked = append(unmarked, a.Shard) // the core holds the shard: report later
				}
			}
			e.node.Start()
			if len(unmarked) > 0 {
				t.Fatalf("shards %v resumed while the store still held a resumable copy", unmarked)
			}

			for _, id := range e.node.Plan().Local {
				c := e.conn(id)
				if id != victim || !tc.resume {
					if c.Attempt.Resume {
						t.Fatalf("shard %d resumes; want a new session\n%s", id, e.events(id))
					}
					if d := e.diag(id); d.Restored {
						t.Errorf("shard %d diag says restored", id)
					}
					continue
				}
				a := c.Attempt
				if !a.Resume || a.Session.ID != restoredID || a.Sequence != 77 || a.Session.ResumeURL != tc.snap.Session.ResumeURL {
					t.Fatalf("shard %d attempt: resume %v session %q at %d via %q; want a resume of the snapshot at 77\n%s",
						id, a.Resume, a.Session.ID, a.Sequence, a.Session.ResumeURL, e.events(id))
				}
				got, _ := store.Get(victim)
				if !got.Used() || got.Sequence != 77 || got.SavedAt != tc.snap.SavedAt {
					t.Errorf("stored copy after the resume: %+v; want the snapshot marked used", got)
				}
			}
			ev := e.events(victim)
			if tc.want == "" {
				if strings.Contains(ev, "snapshot") {
					t.Errorf("events mention a snapshot that was not there:\n%s", ev)
				}
			} else if !strings.Contains(ev, tc.want) {
				t.Errorf("shard %d events lack %q:\n%s", victim, tc.want, ev)
			}
			if tc.level != "" {
				event := strings.Fields(tc.want[strings.Index(tc.want, "event=")+len("event="):])[0]
				if !strings.Contains(e.log.String(), "level="+tc.level+" msg="+event) {
					t.Errorf("slog lacks %s at %s:\n%s", event, tc.level, e.log.String())
				}
			}
			if !tc.resume && tc.snap != nil {
				// Ignoring changes nothing in the store.
				if got, _ := store.Get(victim); got != *tc.snap {
					t.Errorf("stored copy changed: %+v; want %+v", got, *tc.snap)
				}
			}
			for _, id := range []int{0, 2, 3} {
				if strings.Contains(e.events(id), "snapshot") {
					t.Errorf("shard %d events mention shard %d's snapshot:\n%s", id, victim, e.events(id))
				}
			}
			e.checkNoSecret(t)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Rule (DESIGN 7.1): a clean stop (Close, the stop command, stop all)
// saves, after the socket closed with 4000, the snapshot of every shard
// whose session and sequence are valid, with saved_at the clock's time;
// nothing else is saved: no FATAL shard, no invalid session, no shard the
// lease stopped (another node may take it), nothing on a failure.
func TestCleanStopSaves(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup brings the shards READY (shard id at sequence 10+id) and
		// may break some; stop is the clean stop.
		setup func(e *storeEnv)
		stop  func(e *storeEnv)
		saved []int // shards whose snapshot must be saved
	}{
		{name: "Close", stop: func(e *storeEnv) { e.node.Close() }, saved: []int{0, 1, 2, 3}},
		{name: "stop", stop: func(e *storeEnv) { e.exec(2, "stop") }, saved: []int{2}},
		{name: "stop IDs", stop: func(e *storeEnv) { e.exec(-1, "stop 1 3") }, saved: []int{1, 3}},
		{name: "stop all", stop: func(e *storeEnv) { e.exec(-1, "stop all") }, saved: []int{0, 1, 2, 3}},
		{name: "Close after failures", setup: func(e *storeEnv) {
			e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: 4004})
			e.conn(1).Link.Fail(core.Failure{Class: core.NewSession, Err: errDrop, Code: 4009})
			e.conn(2).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop, Code: 1006}) // BACKOFF, still resumable
		}, stop: func(e *storeEnv) { e.node.Close() }, saved: []int{2, 3}},
		{name: "failures alone save nothing", setup: func(e *storeEnv) {
			e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: 4004})
			e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop, Code: 1006})
			e.clk.Advance(time.Minute)
		}, stop: func(e *storeEnv) {}},
		{name: "lease expiry is not a clean stop", setup: func(e *storeEnv) {
			e.exec(-1, "lease 10s")
			e.clk.Advance(10 * time.Second)
			e.wantState(0, core.Stopped)
		}, stop: func(e *storeEnv) { e.node.Close() }},
		{name: "identifying after identify", setup: func(e *storeEnv) { e.exec(3, "identify") },
			stop: func(e *storeEnv) { e.node.Close() }, saved: []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStoreEnv(t, core.Config{}, nil)
			e.node.Start()
			for id := range 4 {
				e.conn(id).Link.Ready(core.Session{ID: secretSession, ResumeURL: fmt.Sprintf("wss://r%d.example", id)}, int64(10+id))
			}
			if tc.setup != nil {
				tc.setup(e)
			}
			e.clk.Advance(1500 * time.Millisecond)
			stopAt := e.clk.Now()
			tc.stop(e)
			want := map[int]bool{}
			for _, id := range tc.saved {
				want[id] = true
			}
			for id := range 4 {
				got, ok := e.store.Get(id)
				if !want[id] {
					if ok {
						t.Errorf("shard %d saved %+v; want nothing", id, got)
					}
					continue
				}
				wantSnap := core.Snapshot{Flavor: core.Discord, Session: core.Session{ID: secretSession, ResumeURL: fmt.Sprintf("wss://r%d.example", id)},
					Sequence: int64(10 + id), Total: 4, SavedAt: stopAt}
				if !ok || got != wantSnap {
					t.Errorf("shard %d saved %+v (%v); want %+v", id, got, ok, wantSnap)
				}
				if codes := e.conn(id).Closed(); len(codes) == 0 || codes[len(codes)-1] != 4000 {
					t.Errorf("shard %d closed with %v; want 4000 before its save", id, codes)
				}
				if ev := e.events(id); !strings.Contains(ev, fmt.Sprintf("event=snapshot-saved sequence=%d", 10+id)) {
					t.Errorf("shard %d events lack the save:\n%s", id, ev)
				}
			}
			e.checkNoSecret(t)
		})
	}
}

// A save that fails or outlives its bound is an Error line in the shard's
// events; Close saves all shards at once (each save waits here for all the
// others to start, which a Close saving one at a time would never see) and
// returns when every save has ended.
func TestCleanStopSaveFailures(t *testing.T) {
	const shards = 8
	var inFlight sync.WaitGroup
	inFlight.Add(shards)
	store := &coretest.Store{OnSave: func(ctx context.Context, shard int, snap core.Snapshot) error {
		inFlight.Done()
		all := make(chan struct{})
		go func() { inFlight.Wait(); close(all) }()
		select {
		case <-all:
		case <-ctx.Done():
			return fmt.Errorf("shard %d saved alone", shard)
		}
		switch shard {
		case 5:
			return errors.New("no space left on device")
		case 6:
			return coretest.Block(ctx)
		}
		return nil
	}}
	e := newStoreEnv(t, core.Config{Plan: core.Range(shards, 0, shards-1), StoreTimeout: 2 * time.Second}, store)
	e.node.Start()
	for id := range shards {
		e.ready(id, 5)
	}
	e.node.Close()
	for id := range shards {
		ev := e.events(id)
		switch id {
		case 5:
			if !strings.Contains(ev, `event=snapshot-error op=save err="no space left on device"`) {
				t.Errorf("shard 5 events lack the failed save:\n%s", ev)
			}
		case 6:
			if !strings.Contains(ev, `event=snapshot-error op=save err="the session store took over 2s"`) {
				t.Errorf("shard 6 events lack the save over the bound:\n%s", ev)
			}
		default:
			if _, ok := store.Get(id); !ok || !strings.Contains(ev, "event=snapshot-saved") {
				t.Errorf("shard %d not saved:\n%s", id, ev)
			}
		}
	}
	if n := strings.Count(e.log.String(), "level=ERROR msg=snapshot-error"); n != 2 {
		t.Errorf("%d Error lines for the saves; want 2:\n%s", n, e.log.String())
	}
	if s := e.diag(5).State; s != core.Stopped {
		t.Errorf("shard 5 is %v after its failed save; want STOPPED", s)
	}
}

// Rule: a shard that its stop saved, started again by the operator in the
// same process, marks the stored copy used before it resumes the session
// again; when the mark fails it identifies.
func TestStartAfterStopMarksUsed(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprint("mark fails ", fail), func(t *testing.T) {
			var failMark bool
			var mu sync.Mutex
			store := &coretest.Store{OnSave: func(ctx context.Context, shard int, snap core.Snapshot) error {
				mu.Lock()
				defer mu.Unlock()
				if failMark && snap.Used() {
					return errors.New("store is read-only")
				}
				return nil
			}}
			e := newStoreEnv(t, core.Config{}, store)
			e.startAll()
			e.exec(2, "stop")
			if got, _ := store.Get(2); got.Used() {
				t.Fatalf("stop saved %+v; want it resumable", got)
			}
			mu.Lock()
			failMark = fail
			mu.Unlock()
			e.exec(2, "start")
			got, _ := store.Get(2)
			a := e.conn(2).Attempt
			if fail {
				if a.Resume || got.Used() {
					t.Fatalf("after a failed mark: resume %v, stored used %v; want an identify and the copy untouched", a.Resume, got.Used())
				}
				if !strings.Contains(e.events(2), `event=snapshot-error op=mark-used err="store is read-only" then="new session"`) {
					t.Errorf("events lack the failed mark:\n%s", e.events(2))
				}
				return
			}
			if !a.Resume || !got.Used() {
				t.Fatalf("after start: resume %v, stored used %v; want a resume with the copy marked used", a.Resume, got.Used())
			}
			// The stored copy was marked before the connection started.
			calls := store.Calls()
			if last := calls[len(calls)-1]; last.Op != "save" || !last.Snap.Used() {
				t.Errorf("last store call %+v; want the mark", last)
			}
		})
	}
}

// Rule (DESIGN 7.1, issue 11 item 4): a shard that resumed a loaded
// snapshot reports session_epoch 0, session_restored yes and the
// snapshot's age until it next starts a new session.
func TestRestoredSessionDiag(t *testing.T) {
	store := &coretest.Store{}
	store.Put(1, snapAt(core.Discord, 42*time.Second))
	e := newStoreEnv(t, core.Config{}, store)
	e.node.Start()
	e.conn(1).Link.Resumed(90)
	diagText := func() string { d := e.diag(1); return string(d.AppendText(nil, e.clk.Now())) }
	for _, want := range []string{"state READY\n", "sequence 90\n", "session resumable\n", "session_epoch 0\n", "session_restored yes\n", "snapshot_age_ms 42000\n", "resumes 1\n", "identifies 0\n"} {
		if !strings.Contains(diagText(), want) {
			t.Errorf("diag lacks %q:\n%s", want, diagText())
		}
	}
	if !strings.Contains(e.events(1), "event=resumed epoch=0 sequence=90") {
		t.Errorf("events lack the resume at epoch 0:\n%s", e.events(1))
	}
	// A transient failure resumes the same session: still restored.
	e.conn(1).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.clk.Advance(5 * time.Second)
	e.conn(1).Link.Resumed(91)
	if txt := diagText(); !strings.Contains(txt, "session_epoch 0\n") || !strings.Contains(txt, "session_restored yes\n") {
		t.Errorf("after a second resume:\n%s", txt)
	}
	// A new session ends it.
	e.conn(1).Link.Fail(core.Failure{Class: core.NewSession, Err: errDrop, Code: 4009})
	e.clk.Advance(5 * time.Second)
	e.ready(1, 1)
	txt := diagText()
	if d := e.diag(1); d.Epoch == 0 || d.Restored || !strings.Contains(txt, "session_restored no\n") || !strings.Contains(txt, "snapshot_age_ms none\n") {
		t.Errorf("after a new session: epoch %d\n%s", d.Epoch, txt)
	}
	for _, id := range []int{0, 2, 3} {
		if txt := string(ptr(e.diag(id)).AppendText(nil, e.clk.Now())); !strings.Contains(txt, "session_restored no\n") {
			t.Errorf("shard %d:\n%s", id, txt)
		}
	}
	e.checkNoSecret(t)
}

// Scheduler.Start loads many snapshots at once (the first loads wait here
// until 32 are in flight, which loads one at a time would never reach)
// and still starts the shards, and requests identify slots, in shard order.
func TestStartLoadsConcurrently(t *testing.T) {
	const shards, together = 1024, 32
	var inFlight sync.WaitGroup
	inFlight.Add(together)
	all := make(chan struct{})
	go func() { inFlight.Wait(); close(all) }()
	store := &coretest.Store{OnLoad: func(ctx context.Context, shard int) error {
		if shard < together {
			inFlight.Done()
			select {
			case <-all:
			case <-ctx.Done():
				return fmt.Errorf("shard %d loaded alone", shard)
			}
		}
		return nil
	}}
	for id := range shards {
		if id%2 == 0 {
			s := snapAt(core.Discord, time.Second)
			s.Total = shards
			store.Put(id, s)
		}
	}
	e := newStoreEnv(t, core.Config{Plan: core.Range(shards, 0, shards-1), StoreTimeout: 2 * time.Second}, store, shards)
	e.node.Start()
	conns := e.tr.Conns()
	if len(conns) != shards {
		t.Fatalf("%d connections after Start; want %d", len(conns), shards)
	}
	for i, c := range conns {
		if c.Attempt.Shard != i || c.Attempt.Resume != (i%2 == 0) {
			t.Fatalf("connection %d: shard %d resume %v; want shard %d, resume %v", i, c.Attempt.Shard, c.Attempt.Resume, i, i%2 == 0)
		}
	}
	if ev := readLog(e.node.Events()); strings.Contains(ev, "snapshot-error") {
		t.Fatalf("a load failed:\n%s", ev)
	}
}

// An operator's start of a shard that Scheduler.Start never started loads its
// snapshot first, like Scheduler.Start would.
func TestStartCommandLoadsFirst(t *testing.T) {
	store := &coretest.Store{}
	store.Put(3, snapAt(core.Discord, time.Second))
	e := newStoreEnv(t, core.Config{}, store)
	e.exec(3, "start")
	if a := e.conn(3).Attempt; !a.Resume || a.Session.ID != restoredID || a.Sequence != 77 {
		t.Fatalf("start of an unstarted shard: resume %v at %d; want the snapshot resumed at 77\n%s", a.Resume, a.Sequence, e.events(3))
	}
	if got, _ := store.Get(3); !got.Used() {
		t.Errorf("stored copy %+v; want it marked used", got)
	}
	e.node.Start() // the other shards; shard 3 is not loaded again
	loads := 0
	for _, c := range store.Calls() {
		if c.Op == "load" && c.Shard == 3 {
			loads++
		}
	}
	if loads != 1 {
		t.Errorf("shard 3 loaded %d times; want 1", loads)
	}
}

// A start that does not start a shard leaves its snapshot alone: Scheduler.Start
// skips a shard the operator stopped before it, and start all skips a
// shard whose lease has expired; the store keeps what nothing resumed.
func TestNoStartNoLoad(t *testing.T) {
	store := &coretest.Store{}
	store.Put(2, snapAt(core.Discord, time.Second))
	e := newStoreEnv(t, core.Config{}, store)
	e.exec(2, "stop")
	e.node.Start()
	for _, c := range store.Calls() {
		if c.Shard == 2 {
			t.Fatalf("Scheduler.Start called the store for a stopped shard: %+v", c)
		}
	}
	e.exec(2, "start")
	if a := e.conn(2).Attempt; !a.Resume || a.Sequence != 77 {
		t.Fatalf("start after Scheduler.Start: resume %v at %d; want the snapshot resumed at 77\n%s", a.Resume, a.Sequence, e.events(2))
	}

	// Saved by stop, then its lease expires: start all cannot start it
	// and must not mark its copy used.
	e.ready(1, 5)
	e.exec(1, "stop")
	if got, ok := store.Get(1); !ok || got.Used() {
		t.Fatalf("stop saved %+v (%v); want a resumable copy", got, ok)
	}
	e.exec(-1, "lease 10s")
	e.clk.Advance(10 * time.Second)
	before := len(store.Calls())
	if err := e.node.ExecNode("start all"); err != nil {
		t.Fatal(err)
	}
	for _, c := range store.Calls()[before:] {
		if c.Shard == 1 {
			t.Fatalf("start all called the store for shard 1, which its lease keeps stopped: %+v", c)
		}
	}
	if got, _ := store.Get(1); got.Used() {
		t.Fatalf("shard 1's copy %+v was marked used", got)
	}
}

// BenchmarkStartRestore1024 starts 1,024 shards whose snapshots are all
// resumable, from a store whose every call takes 1 ms (a file read or an
// fsync'd replace): loads and marks run 64 at a time, so the start takes
// about 2*1024/64 ms rather than 2 s.
func BenchmarkStartRestore1024(b *testing.B) {
	const shards = 1024
	slow := func(ctx context.Context) error {
		select {
		case <-time.After(time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for b.Loop() {
		b.StopTimer()
		store := &coretest.Store{
			OnLoad: func(ctx context.Context, _ int) error { return slow(ctx) },
			OnSave: func(ctx context.Context, _ int, _ core.Snapshot) error { return slow(ctx) },
		}
		for id := range shards {
			s := snapAt(core.Discord, time.Second)
			s.Total = shards
			store.Put(id, s)
		}
		clk := clock.NewFake()
		tr := &coretest.Transport{}
		n, err := core.New(core.Config{Plan: core.Range(shards, 0, shards-1), Transport: tr, Clock: clk, Sessions: store})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		n.Start()
		b.StopTimer()
		if c := len(tr.Conns()); c != shards {
			b.Fatalf("%d connections; want %d", c, shards)
		}
		n.Close()
		b.StartTimer()
	}
}
