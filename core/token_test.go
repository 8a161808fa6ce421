package core_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

var errAuth = errors.New("gateway closed the connection with 4004 (authentication failed)")

// nodeEvents is the node's events log.
func nodeEvents(e *env) string {
	l := e.node.Events()
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	return string(buf[:n])
}

// A wrong token is the bot's failure (issue 22, item 11): at
// max_concurrency 1, eight shards queue for identify slots; the first
// one's 4004 sends all eight FATAL at once, with one token-refused line
// in the node's events, and no shard connects afterwards, however long
// the clock runs. The operator's retry on one shard clears the mark: that
// shard asks for a slot again.
func TestTokenRefusedSweepsQueue(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(8, 0, 7)}, maxConcurrency(1))
	e.node.Start()
	if got := len(e.tr.Conns()); got != 1 {
		t.Fatalf("%d connections at start with max_concurrency 1; want 1", got)
	}
	e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Code: 4004, Token: true, Err: errAuth})
	for id := range 8 {
		e.wantState(id, core.Fatal)
	}
	e.clk.Advance(10 * time.Minute)
	if got := len(e.tr.Conns()); got != 1 {
		t.Fatalf("%d connections after the token was refused; want still 1 (no identify spent)", got)
	}
	ev := nodeEvents(e)
	if n := strings.Count(ev, "event=token-refused"); n != 1 {
		t.Fatalf("node events hold %d token-refused lines; want 1:\n%s", n, ev)
	}
	if n := strings.Count(ev, "event=fatal"); n != 1 {
		t.Fatalf("node events hold %d fatal lines; want shard 0's alone (the others are said by token-refused):\n%s", n, ev)
	}
	if !strings.Contains(e.events(5), "event=fatal") || !strings.Contains(e.events(5), "token was refused") {
		t.Fatalf("shard 5's events do not say why it is FATAL:\n%s", e.events(5))
	}
	e.exec(5, "retry")
	e.clk.Advance(10 * time.Second)
	if c := e.tr.Last(5); c == nil {
		t.Fatalf("shard 5 did not connect after the operator's retry; events:\n%s", e.events(5))
	}
	if st := e.diag(6).State; st != core.Fatal {
		t.Fatalf("shard 6 state %v after shard 5's retry; want FATAL (only the retried shard starts)", st)
	}
}

// Shards in every running state go FATAL at the first refusal of the
// token: READY, BACKOFF (its reconnect would find the token refused) and
// STARTING; a STOPPED shard stays STOPPED, and the operator's start is a
// new try (it clears the mark, as retry does).
func TestTokenRefusedSweepsEveryState(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(5, 0, 4)})
	e.node.Start()
	e.ready(0, 1)
	e.ready(1, 1)
	e.conn(2).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.wantState(2, core.Backoff)
	e.exec(4, "stop")
	e.wantState(4, core.Stopped)
	conns := len(e.tr.Conns())
	e.conn(3).Link.Fail(core.Failure{Class: core.FatalFailure, Code: 4004, Token: true, Err: errAuth})
	for id := range 4 {
		e.wantState(id, core.Fatal)
	}
	e.wantState(4, core.Stopped)
	e.exec(4, "start")
	// start clears the mark, as retry does: the operator's start is a try.
	e.clk.Advance(10 * time.Second) // the bucket's identify slot
	if got := len(e.tr.Conns()); got != conns+1 {
		t.Fatalf("%d connections after the operator's start; want %d", got, conns+1)
	}
	e.clk.Advance(time.Hour)
	if got := len(e.tr.Conns()); got != conns+1 {
		t.Fatalf("%d connections an hour later; want %d (the FATAL shards stay down)", got, conns+1)
	}
}

// A FATAL failure that is not the token's (4010 invalid shard) stays the
// shard's own: the others keep running.
func TestFatalNotTokenStaysLocal(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(2, 0, 1)})
	e.startAll()
	e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Code: 4010, Err: errors.New("invalid shard")})
	e.wantState(0, core.Fatal)
	e.wantState(1, core.Ready)
	if strings.Contains(nodeEvents(e), "token-refused") {
		t.Fatalf("a 4010 logged a token refusal:\n%s", nodeEvents(e))
	}
}

// A shard that the lease kept STOPPED when the token was refused, and
// that a new grant starts later (no operator's command), goes FATAL
// without connecting: no identify slot, and no resume either (the
// gateway refuses the token on a resume as on an identify).
func TestTokenRefusedLaterStart(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(2, 0, 1)})
	e.exec(1, "lease 1m")
	e.startAll()
	e.clk.Advance(61 * time.Second)
	e.wantState(1, core.Stopped)
	e.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Code: 4004, Token: true, Err: errAuth})
	e.wantState(0, core.Fatal)
	e.wantState(1, core.Stopped)
	conns := len(e.tr.Conns())
	e.exec(1, "lease 1m")
	e.clk.Advance(10 * time.Second)
	e.wantState(1, core.Fatal)
	if got := len(e.tr.Conns()); got != conns {
		t.Fatalf("%d connections after the new grant; want %d (no connection)", got, conns)
	}
}
