package core_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// Commands share a rolling budget per connection: the part of the limit not
// reserved for heartbeats, identify and resume. A resume keeps the send
// history; a new session clears it.
func TestSendBudget(t *testing.T) {
	pol := core.SendPolicy{Limit: 5, Reserve: 2, Window: time.Minute, Queue: 2}
	e := newEnv(t, core.Config{Send: pol})
	e.startAll()
	cmd := []byte(`{"op":3,"d":{"status":"idle"}}`)
	for i := range 5 {
		if err := e.node.Send(0, cmd); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if n := len(e.conn(0).Sent()); n != 3 {
		t.Fatalf("sent %d at once; want the budget of 3", n)
	}
	if err := e.node.Send(0, cmd); !errors.Is(err, core.ErrBusy) {
		t.Fatalf("send with a full queue = %v; want ErrBusy", err)
	}
	e.clk.Advance(time.Minute)
	if n := len(e.conn(0).Sent()); n != 5 {
		t.Fatalf("after a window %d sent; want 5", n)
	}
	// Resume: the history of the last window survives, so the budget is
	// still used up.
	e.clk.Advance(30 * time.Second)
	e.exec(0, "reset")
	e.conn(0).Link.Resumed(1)
	e.node.Send(0, cmd)
	e.node.Send(0, cmd)
	if n := len(e.conn(0).Sent()); n != 1 {
		t.Fatalf("after resume %d sent at once; want 1 (two of three still in the window)", n)
	}
	// New session: history cleared.
	e.exec(0, "identify")
	e.ready(0, 1)
	for range 3 {
		e.node.Send(0, cmd)
	}
	if n := len(e.conn(0).Sent()); n != 3 {
		t.Fatalf("after a new session %d sent at once; want 3", n)
	}
}

func TestSendRefusals(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.node.Start()
	for _, tc := range []struct {
		payload string
		is      error
		word    string
	}{
		{`{"op":3,"d":{}}`, core.ErrBusy, "STARTING"},
		{`{"op":3,"d":"` + strings.Repeat("x", 4100) + `"}`, core.ErrTooLarge, "4096"},
		{" " + `{"op":3,"d":"` + strings.Repeat("x", core.MaxPayload-15) + `"}`, core.ErrTooLarge, "4097 bytes as written, white space included (1 here)"},
		{`not json`, core.ErrUsage, "JSON"},
		{`{"d":{}}`, core.ErrUsage, "no op"},
		{`{"op":2,"d":{}}`, core.ErrUsage, "op 2"},
		{`{"op":6}`, core.ErrUsage, "op 6"},
		{`{"op":1,"d":null}`, core.ErrUsage, "op 1"},
	} {
		err := e.node.Send(0, []byte(tc.payload))
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.word) {
			t.Errorf("Send(%.30q) = %v; want %v mentioning %q", tc.payload, err, tc.is, tc.word)
		}
	}
	if err := e.node.Send(99, []byte(`{"op":3}`)); !errors.Is(err, core.ErrUnknownShard) {
		t.Errorf("Send to shard 99 = %v; want ErrUnknownShard", err)
	}
}

// Fluxer's op 9 keeps the socket open: the shard identifies on it once the
// pacer grants a slot, without a new connection or a reconnect.
func TestInvalidatedIdentifiesOnSocket(t *testing.T) {
	e := newEnv(t, core.Config{Flavor: core.Fluxer})
	e.startAll()
	c := e.conn(0)
	conns := len(e.tr.Conns())
	c.Link.Invalidated()
	e.clk.Advance(10 * time.Second)
	d := e.diag(0)
	if c.Identifies() != 1 || len(e.tr.Conns()) != conns || d.Reconnects != 0 || d.SequenceValid || d.Phase != core.PhaseIdentify {
		t.Fatalf("after op 9: socket identifies %d, conns %d->%d, %+v", c.Identifies(), conns, len(e.tr.Conns()), d)
	}
	c.Link.Ready(core.Session{ID: secretSession}, 1)
	e.wantState(0, core.Ready)
}

// Secrets never appear in the tree or the logs.
func TestSessionIDNeverShown(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.conn(0).Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
	e.clk.Advance(5 * time.Second)
	e.conn(0).Link.Resumed(1)
	if e.conn(0).Attempt.Session.ID != secretSession {
		t.Fatal("the transport did not get the session to resume")
	}
	d := e.diag(0)
	shown := []string{e.events(0), string(d.AppendText(nil, e.clk.Now()))}
	s := core.Session{ID: secretSession, ResumeURL: "wss://x"}
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		shown = append(shown, fmtSprintf(f, s), fmtSprintf(f, e.conn(0).Attempt))
	}
	js, _ := json.Marshal(struct{ S core.Session }{s})
	shown = append(shown, string(js))
	for _, text := range shown {
		if strings.Contains(text, secretSession) {
			t.Fatalf("the session ID leaked into %q", text)
		}
	}
}

// Commands waiting for the budget belong to the connection they were
// accepted on: whatever closes it or ends its session drops them, with one
// events line that says how many and why. None is sent later, on another
// connection or session.
func TestSendQueueDropped(t *testing.T) {
	fail := func(class core.FailureClass) func(e *env) {
		return func(e *env) { e.conn(0).Link.Fail(core.Failure{Class: class, Err: errDrop, Code: 4000}) }
	}
	for _, tc := range []struct {
		name   string
		flavor core.Flavor
		do     func(e *env)
		reason string
	}{
		{"op 9", core.Fluxer, func(e *env) { e.conn(0).Link.Invalidated() }, `"session invalidated"`},
		{"reset", core.Discord, func(e *env) { e.exec(0, "reset") }, `"operator reset"`},
		{"transient failure", core.Discord, fail(core.Transient), `"connection closed"`},
		{"fatal failure", core.Discord, fail(core.FatalFailure), `"fatal failure"`},
		{"new session", core.Discord, fail(core.NewSession), `"new session"`},
		{"identify", core.Discord, func(e *env) { e.exec(0, "identify") }, `"new session"`},
		{"stop", core.Discord, func(e *env) { e.exec(0, "stop") }, "stopped"},
		{"close", core.Discord, func(e *env) { e.node.Close() }, "shutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, core.Config{Flavor: tc.flavor, Send: core.SendPolicy{Limit: 5, Reserve: 2, Window: time.Minute, Queue: 4}})
			e.startAll()
			c := e.conn(0)
			for i := range 5 {
				if err := e.node.Send(0, []byte(`{"op":3,"d":{}}`)); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			tc.do(e)
			want := "event=send-dropped dropped=2 reason=" + tc.reason + "\n"
			if ev := e.events(0); strings.Count(ev, "event=send-dropped") != 1 || !strings.Contains(ev, want) {
				t.Fatalf("events after %s lack one %q line:\n%s", tc.name, want, ev)
			}
			// Whatever follows, a new session on the same socket, a resume
			// or a new session on a new connection, the dropped commands
			// never go out.
			for range 3 {
				e.clk.Advance(time.Minute)
				if last := e.conn(0); e.diag(0).State == core.Starting {
					if last.Attempt.Resume {
						last.Link.Resumed(2)
					} else {
						e.ready(0, 1)
					}
					e.wantState(0, core.Ready)
					e.clk.Advance(time.Minute)
					if last != c && len(last.Sent()) != 0 {
						t.Fatalf("the new connection sent %d commands; want 0", len(last.Sent()))
					}
				}
			}
			if n := len(c.Sent()); n != 3 {
				t.Errorf("the connection sent %d commands; want the 3 the budget allowed at once", n)
			}
			if n := strings.Count(e.events(0), "event=send-dropped"); n != 1 {
				t.Errorf("%d send-dropped lines; want 1", n)
			}
		})
	}
}
