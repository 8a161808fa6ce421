package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"go.uber.org/goleak"
)

// wait bounds every wait in this package: a test never sleeps, it waits on
// a library's event handler or on the simulator's Wait, and fails at this
// deadline.
const wait = 20 * time.Second

// token is the bot token the simulator accepts.
const token = "interop-token"

// newSim starts a Discord-flavour simulator for a two-shard bot with four
// guilds (two per shard), max_concurrency 2, and Discord's own 41.25 s
// heartbeat interval, and closes it when the test ends. The interval is
// kept long on purpose: neither library's heartbeat ticker fires during a
// test, because both misbehave when a tick meets a disconnect or a close
// (see doc.go); heartbeats are asked for with op 1 instead, which both
// answer from their reader goroutine.
func newSim(t *testing.T, rec *recorder, mutate func(*gatewaysim.Config)) *gatewaysim.Server {
	t.Helper()
	cfg := gatewaysim.Config{
		Flavor:         gatewaysim.Discord,
		Token:          token,
		Shards:         2,
		Guilds:         4,
		MaxConcurrency: 2,
		Logger:         slog.New(simLog{rec}),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	sim, err := gatewaysim.New(cfg)
	if err != nil {
		t.Fatalf("gatewaysim.New: %v", err)
	}
	t.Cleanup(func() {
		if err := sim.Close(); err != nil {
			t.Errorf("sim.Close: %v", err)
		}
	})
	return sim
}

// simWait waits for a condition on the simulator's state.
func simWait(t *testing.T, sim *gatewaysim.Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.Wait(ctx, cond); err != nil {
		var sessions []gatewaysim.SessionInfo
		for _, id := range sim.ShardIDs() {
			sessions = append(sessions, sim.Sessions(id)...)
		}
		t.Fatalf("waiting for %s: %v (stats %+v, connections %d, sessions %+v)", what, err, sim.AllStats(), sim.Connections(), sessions)
	}
}

// simLog records, from the simulator's debug log, which URL each resume
// came in on (the simulator logs it; no counter has it).
type simLog struct{ rec *recorder }

func (simLog) Enabled(context.Context, slog.Level) bool { return true }
func (h simLog) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h simLog) WithGroup(string) slog.Handler          { return h }
func (h simLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "gateway session resumed" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "via_resume_url" {
			h.rec.update(func(rec *recorder) { rec.resumeVia = append(rec.resumeVia, a.Value.Bool()) })
		}
		return true
	})
	return nil
}

// testLog is a slog handler for a library: everything at Info and above
// goes to the test log, and errors that mean a payload could not be read
// become problems of the recorder. It
// stops writing to the test once the test's cleanups run, so that a late
// goroutine cannot log into a finished test.
type testLog struct {
	mu  *sync.Mutex
	t   **testing.T
	rec *recorder
}

func newTestLog(t *testing.T, rec *recorder) *slog.Logger {
	h := testLog{mu: new(sync.Mutex), t: &t, rec: rec}
	t.Cleanup(func() {
		h.mu.Lock()
		*h.t = nil
		h.mu.Unlock()
	})
	return slog.New(h)
}

func (h testLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h testLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h testLog) WithGroup(string) slog.Handler                { return h }
func (h testLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	msg := truncate(b.String())
	h.mu.Lock()
	if t := *h.t; t != nil {
		t.Logf("%s: %s", r.Level, msg)
	}
	h.mu.Unlock()
	if r.Level >= slog.LevelError && isDecodeProblem(msg) {
		h.rec.problem("%s", msg)
	}
	return nil
}

// isDecodeProblem tells the library errors that mean it could not read
// what the simulator sent from those a forced disconnect causes on
// purpose (a heartbeat written to a reset connection, say), which are only
// logged.
func isDecodeProblem(msg string) bool {
	msg = strings.ToLower(msg)
	for _, k := range []string{"unmarshal", "decod", "decompress", "uncompress", "parsing", "invalid message data", "unknown event", "unknown op"} {
		if strings.Contains(msg, k) {
			return true
		}
	}
	return false
}

// truncate keeps library log lines readable: some dump whole payloads.
func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// verifyNoLeaks fails the test if a goroutine outlives it; goleak retries
// for a while, so goroutines that are on their way out do not count.
func verifyNoLeaks(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	goleak.VerifyNone(t, opts...)
}

// goroutinesAt counts the goroutines whose innermost frame is function fn
// (a name as goleak prints it).
func goroutinesAt(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.SplitN(g, "\n", 3)
		if len(lines) >= 2 && strings.HasPrefix(lines[1], fn+"(") {
			count++
		}
	}
	return count
}

// recorder collects what a library's event handlers saw. Handlers only
// record and signal; tests wait on the signal with a deadline.
type recorder struct {
	mu      sync.Mutex
	changed chan struct{}

	readies   []readyInfo
	resumed   int
	guilds    map[string]int // GUILD_CREATE guild id → count
	markers   map[string]int // MESSAGE_CREATE content with markerPrefix → count
	order     []string       // markers in arrival order
	other     int            // other MESSAGE_CREATEs (simulator-generated)
	acks      int            // heartbeat ACKs the library reported
	resumeVia []bool         // per resume: did it use resume_gateway_url
	problems  []string       // errors and warnings the library logged
}

type readyInfo struct {
	SessionID string
	Shard     [2]int
	Guilds    []string
	ResumeURL string
}

func newRecorder() *recorder {
	return &recorder{
		changed: make(chan struct{}),
		guilds:  make(map[string]int),
		markers: make(map[string]int),
	}
}

// update changes the recorder under its lock and wakes waiters.
func (r *recorder) update(f func(*recorder)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
	close(r.changed)
	r.changed = make(chan struct{})
}

// view reads the recorder under its lock.
func (r *recorder) view(f func(*recorder)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// until waits for cond, evaluated under the recorder's lock, to hold.
func (r *recorder) until(t *testing.T, what string, cond func(*recorder) bool) {
	t.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("waiting for %s: timed out after %v; readies=%d resumed=%d guilds=%v markers=%v other=%d acks=%d problems=%q",
				what, wait, len(r.readies), r.resumed, r.guilds, r.markers, r.other, r.acks, r.problems)
		}
	}
}

func (r *recorder) message(content string) {
	r.update(func(r *recorder) {
		if strings.HasPrefix(content, markerPrefix) {
			r.markers[content]++
			r.order = append(r.order, content)
		} else {
			r.other++
		}
	})
}

func (r *recorder) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.update(func(r *recorder) { r.problems = append(r.problems, msg) })
}

// checkExactlyOnce fails unless every marker arrived exactly once and in
// the order published.
func (r *recorder) checkExactlyOnce(t *testing.T, published []string) {
	t.Helper()
	r.view(func(r *recorder) {
		for _, m := range published {
			if n := r.markers[m]; n != 1 {
				t.Errorf("marker %q received %d times, want exactly once", m, n)
			}
		}
		if len(r.order) != len(published) {
			t.Errorf("received markers %q, published %q", r.order, published)
			return
		}
		for i := range published {
			if r.order[i] != published[i] {
				t.Errorf("markers arrived in order %q, published %q", r.order, published)
				return
			}
		}
	})
}

// markerPrefix starts the content of every message a test publishes, so
// that they can be told from the simulator's generated traffic.
const markerPrefix = "interop-marker-"

// publisher publishes MESSAGE_CREATE events with unique markers to a shard
// and remembers them in order.
type publisher struct {
	t     *testing.T
	sim   *gatewaysim.Server
	shard int
	total int
	next  int
	sent  []string
}

// publish sends one marked MESSAGE_CREATE in the shard's first guild and
// returns its marker. The event is sequenced into the shard's session even
// while it is disconnected, so that a resume must replay it.
func (p *publisher) publish() string {
	p.t.Helper()
	p.next++
	marker := markerPrefix + strconv.Itoa(p.shard) + "-" + strconv.Itoa(p.next)
	guilds := p.sim.Guilds(p.shard, p.total)
	if len(guilds) == 0 {
		p.t.Fatalf("shard %d/%d has no guild", p.shard, p.total)
	}
	n, err := p.sim.Publish(p.shard, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: messageJSON(guilds[0], p.next, marker)})
	if err != nil {
		p.t.Fatalf("Publish: %v", err)
	}
	if n != 1 {
		p.t.Fatalf("Publish(%q) reached %d sessions, want 1", marker, n)
	}
	p.sent = append(p.sent, marker)
	return marker
}

// messageJSON is a MESSAGE_CREATE d shaped like Discord's message object
// (the fields the Message Create event documents as always present).
func messageJSON(guildID uint64, n int, content string) json.RawMessage {
	const epoch = 1420070400000
	now := time.Now().UTC()
	id := uint64(now.UnixMilli()-epoch)<<22 | uint64(n)
	author := gatewaysim.GuildID(0) - 1<<22
	msg := map[string]any{
		"id":               strconv.FormatUint(id, 10),
		"channel_id":       strconv.FormatUint(guildID+1, 10),
		"guild_id":         strconv.FormatUint(guildID, 10),
		"author":           map[string]any{"id": strconv.FormatUint(author, 10), "username": "interop", "discriminator": "0", "global_name": nil, "avatar": nil},
		"member":           map[string]any{"roles": []string{}, "joined_at": now.Add(-time.Hour).Format(time.RFC3339Nano), "deaf": false, "mute": false, "flags": 0},
		"content":          content,
		"timestamp":        now.Format("2006-01-02T15:04:05.000000+00:00"),
		"edited_timestamp": nil,
		"tts":              false,
		"mention_everyone": false,
		"mentions":         []any{},
		"mention_roles":    []string{},
		"attachments":      []any{},
		"embeds":           []any{},
		"pinned":           false,
		"type":             0,
	}
	b, err := json.Marshal(msg)
	if err != nil {
		panic(err)
	}
	return b
}

// gate holds a library's dials while it is closed, so that a test can
// publish while a shard is certainly disconnected: the event then has to
// come back through the resume's replay. Open by default.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil while open
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

// dial is a websocket.Dialer's NetDialContext.
func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// dialer is a websocket dialer whose dials pass through the gate.
func (g *gate) dialer() *websocket.Dialer {
	return &websocket.Dialer{HandshakeTimeout: wait, NetDialContext: g.dial}
}

// offline waits until none of the shards' sessions is attached to a
// connection.
func offline(t *testing.T, sim *gatewaysim.Server, shards ...int) {
	t.Helper()
	simWait(t, sim, fmt.Sprintf("shards %v offline", shards), func() bool {
		for _, id := range shards {
			for _, s := range sim.Sessions(id) {
				if s.Live {
					return false
				}
			}
		}
		return true
	})
}

// closeIdle ends the keep-alive connections of an HTTP transport a library
// used for discovery, so that their goroutines do not outlive the test.
func closeIdle(tr *http.Transport) { tr.CloseIdleConnections() }
