package core_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/lease/local"
)

// secretSession is what the fake gateway hands out; tests check it never
// appears anywhere a user can see.
const secretSession = "s3cr3t-session-id"

var errDrop = errors.New("connection reset by peer")

// env is a node of fake shards on a fake clock.
type env struct {
	t     testing.TB
	clk   *clock.Fake
	tr    *coretest.Transport
	lease *local.OperatorLease
	node  *core.Scheduler
}

// maxConcurrency is the Discord max_concurrency newEnv's pacer uses unless
// the config names a pacer.
type maxConcurrency int

func newEnv(t testing.TB, cfg core.Config, opts ...maxConcurrency) *env {
	t.Helper()
	e := &env{t: t, clk: clock.NewFake(), tr: &coretest.Transport{}}
	mc := 16
	for _, o := range opts {
		mc = int(o)
	}
	e.lease = local.New(e.clk)
	if cfg.Plan.Total == 0 {
		cfg.Plan = core.Range(4, 0, 3)
	}
	cfg.Transport, cfg.Clock, cfg.Lease = e.tr, e.clk, e.lease
	if cfg.Backoff == nil {
		cfg.Backoff = core.Fixed(5 * time.Second)
	}
	if cfg.Rand == nil {
		cfg.Rand = func() float64 { return 0.5 }
	}
	if cfg.Pacer == nil {
		cfg.Pacer = core.NewDiscordPacer(e.clk, mc)
	}
	cfg.EventRetention, cfg.NodeEventRetention = 1<<20, 8<<20
	n, err := core.New(cfg)
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	e.node = n
	t.Cleanup(n.Close)
	return e
}

func (e *env) diag(id int) core.Diag {
	e.t.Helper()
	d, err := e.node.Diag(id)
	if err != nil {
		e.t.Fatalf("Diag(%d): %v", id, err)
	}
	return d
}

func (e *env) conn(id int) *coretest.Conn {
	e.t.Helper()
	c := e.tr.Last(id)
	if c == nil {
		e.t.Fatalf("shard %d never connected", id)
	}
	return c
}

// ready brings shard id's latest connection to READY with a new session.
func (e *env) ready(id int, seq int64) {
	e.conn(id).Link.Ready(core.Session{ID: secretSession, ResumeURL: "wss://resume.example"}, seq)
}

// startAll starts the node and brings every shard READY at sequence 1.
func (e *env) startAll() {
	e.node.Start()
	for _, id := range e.node.Plan().Local {
		e.ready(id, 1)
	}
}

func (e *env) events(id int) string {
	l, err := e.node.ShardEvents(id)
	if err != nil {
		e.t.Fatal(err)
	}
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	return string(buf[:n])
}

func (e *env) lastEvent(id int) string {
	lines := strings.Split(strings.TrimSpace(e.events(id)), "\n")
	return lines[len(lines)-1]
}

func (e *env) wantState(id int, want core.State) {
	e.t.Helper()
	if got := e.diag(id).State; got != want {
		e.t.Fatalf("shard %d state = %v; want %v\nevents:\n%s", id, got, want, e.events(id))
	}
}

func (e *env) exec(id int, line string) {
	e.t.Helper()
	var err error
	if id < 0 {
		err = e.node.ExecNode(line)
	} else {
		err = e.node.ExecShard(id, line)
	}
	if err != nil {
		e.t.Fatalf("exec %q on %d: %v", line, id, err)
	}
}
