package gateway

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/journal"
)

// wait bounds every wait at the network boundary; a test never sleeps.
// Only a hang reaches it, so it is generous: on a loaded machine under
// -race the simulator's oversized (10 MiB) message took over 10 s to reach
// the client's refusal.
const wait = 60 * time.Second

const testToken = "sim-token"

// env is a core.Scheduler driving a Transport against a simulator, all on one
// fake clock.
type env struct {
	t      testing.TB
	clk    *clock.Fake
	sim    *gatewaysim.Server
	tr     *Transport
	node   *core.Scheduler
	pacer  *countingPacer
	sink   *recorder
	logs   *syncBuffer
	flavor core.Flavor
}

type envConfig struct {
	flavor   core.Flavor
	compress Compression
	shards   int // local shards 0..shards-1 of a total of shards
	sim      gatewaysim.Config
	tr       func(*Config, *gatewaysim.Server)
	// pacer, when set, replaces the flavor's in-memory pacer.
	pacer core.IdentifyPacer
	// noDiscover skips the discovery a binary does before starting.
	noDiscover bool
	// wrap, when set, wraps the transport the node uses.
	wrap  func(core.Transport) core.Transport
	token string // default testToken, for the simulator and the client
	// clk, when set, is the env's clock (for a pacer made before the env).
	clk *clock.Fake
	// confirm, when set, is the core's Confirmer (confirmed delivery).
	confirm core.Confirmer
}

func newEnv(t testing.TB, ec envConfig) *env {
	t.Helper()
	if ec.shards == 0 {
		ec.shards = 1
	}
	e := &env{t: t, clk: ec.clk, sink: newRecorder(), logs: &syncBuffer{}, flavor: ec.flavor}
	if e.clk == nil {
		e.clk = clock.NewFake()
	}
	if ec.token == "" {
		ec.token = testToken
	}
	sc := ec.sim
	sc.Clock = e.clk
	if sc.Token == "" {
		sc.Token = ec.token
	}
	if sc.Logger == nil {
		sc.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if ec.flavor == core.Fluxer {
		sc.Flavor = gatewaysim.Fluxer
	}
	if sc.Shards == 0 {
		sc.Shards = ec.shards
	}
	if sc.MaxConcurrency == 0 {
		sc.MaxConcurrency = ec.shards
	}
	if sc.HeartbeatInterval == 0 {
		// Far enough that no heartbeat falls inside a test that does not
		// ask for one.
		sc.HeartbeatInterval = time.Hour
	}
	sim, err := gatewaysim.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	e.sim = sim
	logger := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := Config{
		Flavor:      ec.flavor,
		Token:       ec.token,
		Intents:     uint64(gatewaysim.IntentGuilds | gatewaysim.IntentGuildMessages),
		API:         sim.APIURL(),
		Compression: ec.compress,
		Sink:        e.sink.sink,
		Clock:       e.clk,
		Rand:        func() float64 { return 0.5 },
		Logger:      logger,
		// The tests step the fake clock by exactly the pacer's 5 s; the
		// gate's own tests turn it on (gate_test.go).
		IdentifyMargin: -1,
	}
	if ec.pacer != nil {
		e.pacer = &countingPacer{p: ec.pacer}
	} else if ec.flavor == core.Fluxer {
		e.pacer = &countingPacer{p: core.NewFluxerPacer(e.clk, core.FluxerPacing{Budget: 300, Window: time.Minute})}
	} else {
		p := core.NewDiscordPacer(e.clk, 1)
		e.pacer = &countingPacer{p: p}
		cfg.OnStartLimit = p.SetStartLimit
	}
	if ec.tr != nil {
		ec.tr(&cfg, sim)
	}
	tr, err := New(cfg)
	if err != nil {
		sim.Close()
		t.Fatal(err)
	}
	e.tr = tr
	var ct core.Transport = tr
	if ec.wrap != nil {
		ct = ec.wrap(tr)
	}
	node, err := core.New(core.Config{
		Plan:      core.Range(ec.shards, 0, ec.shards-1),
		Flavor:    ec.flavor,
		Transport: ct,
		Pacer:     e.pacer,
		Confirm:   ec.confirm,
		Backoff:   core.Fixed(5 * time.Second),
		Clock:     e.clk,
		Rand:      func() float64 { return 0.5 },
		Logger:    logger,
		// Large enough that no test loses a line.
		EventRetention: 1 << 20, NodeEventRetention: 8 << 20,
	})
	if err != nil {
		tr.Close()
		sim.Close()
		t.Fatal(err)
	}
	e.node = node
	t.Cleanup(func() {
		node.Close()
		tr.Close()
		sim.Close()
	})
	if !ec.noDiscover && cfg.GatewayURL == "" {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if _, err := tr.Discover(ctx); err != nil {
			t.Fatalf("Discover() = %v", err)
		}
	}
	return e
}

// start starts the node and waits until every shard is READY and the sink
// has everything the simulator sent.
func (e *env) start() {
	e.t.Helper()
	e.node.Start()
	for _, id := range e.node.Plan().Local {
		e.waitEvent(id, 0, "ready")
		e.synced(id)
	}
}

func (e *env) diag(id int) core.Diag {
	e.t.Helper()
	d, err := e.node.Diag(id)
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) events(id int) *journal.Log {
	e.t.Helper()
	l, err := e.node.ShardEvents(id)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func logText(l *journal.Log, from int64) string {
	buf := make([]byte, l.Size()-from)
	n, _ := l.ReadAt(buf, from)
	return string(buf[:n])
}

// mark returns the current end of shard id's events log.
func (e *env) mark(id int) int64 { return e.events(id).Size() }

// waitEvent waits until shard id logs a line with event=name at or after
// offset from, and returns the offset after that line.
func (e *env) waitEvent(id int, from int64, name string) int64 {
	e.t.Helper()
	l := e.events(id)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		ch := l.Notify()
		text := logText(l, from)
		off := from
		for _, line := range strings.SplitAfter(text, "\n") {
			off += int64(len(line))
			if strings.Contains(line, " event="+name+" ") || strings.HasSuffix(strings.TrimSpace(line), " event="+name) {
				return off
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			e.t.Fatalf("shard %d: no event=%s after offset %d; events:\n%s\nlogs:\n%s", id, name, from, logText(l, 0), e.logs.String())
			return 0
		}
	}
}

// waitBackoff waits for shard id to enter BACKOFF after offset from, and
// until the core has armed its reconnect timer: the core logs the line
// before it arms the timer, under the shard's lock, so a Diag (which takes
// that lock) returns only once the timer exists and Advance can fire it.
func (e *env) waitBackoff(id int, from int64) int64 {
	e.t.Helper()
	off := e.waitEvent(id, from, "backoff")
	e.diag(id)
	return off
}

// poll calls cond every millisecond until it holds, for at most wait, and
// reports whether it did: for states that follow the simulator's frames,
// network events a test can only poll for.
func poll(cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// drop drops shard id's connection and waits until the shard backs off
// and the simulator has seen the connection go, as it would long before a
// real backoff ran out. It returns the offset drop started at.
func (e *env) drop(id int) int64 {
	e.t.Helper()
	m := e.mark(id)
	e.sim.Inject(id, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	e.waitBackoff(id, m)
	e.simWait("the old connection to end", func() bool { return e.sim.Stats(id).LiveSessions == 0 })
	return m
}

// path returns the states shard id went through after offset from, as its
// event lines show them.
func (e *env) path(id int, from int64) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logText(e.events(id), from)), "\n") {
		ev, st := field(line, "event"), field(line, "state")
		switch ev {
		case "ready", "resumed":
			st = "READY"
		case "backoff", "retry", "fatal", "invalidated", "stopped":
		default:
			continue
		}
		if n := len(out); st != "" && (n == 0 || out[n-1] != st) {
			out = append(out, st)
		}
	}
	return out
}

func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// simWait waits at the network boundary for a simulator state.
func (e *env) simWait(what string, cond func() bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := e.sim.Wait(ctx, cond); err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// liveSeq returns the sequence of shard id's newest session attached to a
// connection, or -1.
func (e *env) liveSeq(id int) int64 {
	seq := int64(-1)
	for _, s := range e.sim.Sessions(id) {
		if s.Live {
			seq = s.Seq
		}
	}
	return seq
}

// synced waits until the sink has every dispatch the simulator sequenced
// into shard id's live session. It first waits for the simulator to hold
// exactly one live session for the shard: a session the client has just
// left stays attached until the simulator reads the close.
func (e *env) synced(id int) {
	e.t.Helper()
	e.simWait(fmt.Sprintf("shard %d to have one live session", id), func() bool {
		return e.sim.Stats(id).LiveSessions == 1 && e.liveSeq(id) > 0
	})
	want := e.liveSeq(id)
	e.sink.wait(e.t, fmt.Sprintf("shard %d's sink to reach sequence %d", id, want), func() bool { return e.sink.last(id) >= want }, e.logs)
}

// publish sends n MESSAGE_CREATE events to shard id's sessions.
func (e *env) publish(id, n int) {
	e.t.Helper()
	for i := range n {
		d := fmt.Sprintf(`{"id":"%d","content":"event %d"}`, 1000+i, i)
		if _, err := e.sim.Publish(id, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(d)}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// countingPacer counts identify slot requests.
type countingPacer struct {
	p  core.IdentifyPacer
	mu sync.Mutex
	n  int
}

func (c *countingPacer) BudgetWait(op bool) time.Time { return c.p.BudgetWait(op) }

func (c *countingPacer) Request(shard int, op bool, grant func()) (bool, func()) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.p.Request(shard, op, grant)
}

// IdentifyBy passes on the wrapped pacer's slot deadlines, if it has any.
func (c *countingPacer) IdentifyBy(shard int) (time.Duration, func(), bool) {
	if d, ok := c.p.(core.SlotDeadliner); ok {
		return d.IdentifyBy(shard)
	}
	return 0, nil, false
}

func (c *countingPacer) requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// recorder is a Sink that keeps what it saw, per shard.
type recorder struct {
	mu     sync.Mutex
	shards map[int][]delivered
	ch     chan struct{} // closed by the next delivery
}

type delivered struct {
	seq     int64
	name    string
	d       string
	session string // the session key
}

func newRecorder() *recorder { return &recorder{shards: map[int][]delivered{}} }

func (r *recorder) sink(shard int, session string, seq int64, name string, d []byte) {
	r.mu.Lock()
	r.shards[shard] = append(r.shards[shard], delivered{seq, name, string(d), session})
	ch := r.ch
	r.ch = nil
	r.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

func (r *recorder) notify() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

func (r *recorder) get(shard int) []delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivered(nil), r.shards[shard]...)
}

// last is the highest sequence delivered for shard in its latest session.
func (r *recorder) last(shard int) int64 {
	evs := r.get(shard)
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].seq >= 0 {
			return evs[i].seq
		}
	}
	return -1
}

func (r *recorder) wait(t testing.TB, what string, cond func() bool, logs *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		ch := r.notify()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v\nsink: %v\nlogs:\n%s", what, ctx.Err(), r.shards, logs.String())
		}
	}
}

// sessions splits shard's deliveries at each READY and checks that every
// session's sequences run 1, 2, 3, ... without a gap or a duplicate. It
// returns the number of sessions and the last sequence of the last one.
func (r *recorder) checkContiguous(t testing.TB, shard int) (sessions int, last int64) {
	t.Helper()
	var next int64
	for i, ev := range r.get(shard) {
		if ev.name == "READY" {
			sessions++
			next = ev.seq
		}
		if ev.seq < 0 {
			continue
		}
		if ev.seq != next {
			t.Fatalf("shard %d delivery %d: sequence %d (%s); want %d\nall: %v", shard, i, ev.seq, ev.name, next, r.get(shard))
		}
		next++
		last = ev.seq
	}
	return sessions, last
}

// syncBuffer collects log output and wakes waiters on every write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	ch chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	return s.b.Write(p)
}

// waitFor waits until the output holds n lines containing substr.
func (s *syncBuffer) waitFor(t testing.TB, substr string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		s.mu.Lock()
		if s.ch == nil {
			s.ch = make(chan struct{})
		}
		ch, got := s.ch, strings.Count(s.b.String(), substr)
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("log has %d lines with %q; want %d", got, substr, n)
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
