package core_test

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
)

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		line string
		want core.Command
	}{
		{"reset all", core.Command{Verb: core.VerbReset, All: true}},
		{"  stop 3 7  ", core.Command{Verb: core.VerbStop, Shards: []int{3, 7}}},
		{"start 0-2 9", core.Command{Verb: core.VerbStart, Shards: []int{0, 1, 2, 9}}},
		{"retry all", core.Command{Verb: core.VerbRetry, All: true}},
		{"identify 5", core.Command{Verb: core.VerbIdentify, Shards: []int{5}}},
		{"lease 30s", core.Command{Verb: core.VerbLease, All: true, Lease: 30 * time.Second}},
		{"lease 2m", core.Command{Verb: core.VerbLease, All: true, Lease: 2 * time.Minute}},
		{"lease off", core.Command{Verb: core.VerbLease, All: true, LeaseOff: true}},
	} {
		got, err := core.ParseCommand(tc.line)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseCommand(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		line string
		want core.Command
	}{
		{"reset", core.Command{Verb: core.VerbReset}},
		{"lease 2s", core.Command{Verb: core.VerbLease, Lease: 2 * time.Second}},
		{"lease off\n", core.Command{Verb: core.VerbLease, LeaseOff: true}},
	} {
		got, err := core.ParseShardCommand(tc.line)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseShardCommand(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

// Bad input gets an error naming the offending word and showing the usage,
// and leaves every shard untouched.
func TestBadCommandsLeaveShardsUntouched(t *testing.T) {
	for _, tc := range []struct {
		shard int // -1: node ctl
		line  string
		word  string
		is    error
	}{
		{-1, "frobnicate", `"frobnicate"`, core.ErrUsage},
		{3, "frobnicate now", `"frobnicate"`, core.ErrUsage},
		{-1, "reset", `"reset"`, core.ErrUsage},
		{3, "reset now", `"now"`, core.ErrUsage},
		{-1, "reset all 3", `"3"`, core.ErrUsage},
		{-1, "reset 1 x", `"x"`, core.ErrUsage},
		{-1, "reset 1 1", `"1"`, core.ErrUsage},
		{-1, "reset 1 0-2", `"0-2"`, core.ErrUsage},
		{-1, "reset 2-1", `"2-1"`, core.ErrUsage},
		{-1, "reset -1", `"-1"`, core.ErrUsage},
		{-1, "reset 1 99", `"99"`, core.ErrUnknownShard},
		{-1, "lease", `"lease"`, core.ErrUsage},
		{3, "lease -5s", `"-5s"`, core.ErrUsage},
		{3, "lease 0s", `"0s"`, core.ErrUsage},
		{-1, "lease 0", `"0"`, core.ErrUsage},
		{-1, "lease 500ms", `"500ms"`, core.ErrUsage},
		{-1, "lease 1000h", `"1000h"`, core.ErrUsage},
		{-1, "lease 30", `"30"`, core.ErrUsage},
		{-1, "lease 30s off", `"off"`, core.ErrUsage},
		{-1, "", `""`, core.ErrUsage},
		{-1, "reset 0-1048574 1048575-2097148", `"0-1048574"`, core.ErrUsage},
		{-1, "reset 0-60000 60001-70000", `"60001-70000"`, core.ErrUsage},
	} {
		e := newEnv(t, core.Config{})
		e.startAll()
		before := e.node.Snapshot(nil)
		conns := len(e.tr.Conns())
		var err error
		if tc.shard < 0 {
			err = e.node.ExecNode(tc.line)
		} else {
			err = e.node.ExecShard(tc.shard, tc.line)
		}
		if err == nil || !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.word) || !strings.Contains(err.Error(), "usage: ") {
			t.Errorf("exec %q = %v; want %v naming %s with the usage", tc.line, err, tc.is, tc.word)
			continue
		}
		if after := e.node.Snapshot(nil); !reflect.DeepEqual(before, after) || len(e.tr.Conns()) != conns {
			t.Errorf("exec %q changed shards", tc.line)
		}
		logged := e.events(max(tc.shard, 0))
		if tc.shard >= 0 && !strings.Contains(logged, "event=rejected cmd=") {
			t.Errorf("exec %q: the rejection is not in the shard's events:\n%s", tc.line, logged)
		}
	}
}

// A command that does not apply to a named shard's state is refused for
// all named shards; with "all" it is skipped.
func TestCommandStateRules(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	e.conn(2).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errors.New("authentication failed"), Code: 4004})
	e.wantState(2, core.Fatal)
	for _, line := range []string{"reset 1 2", "stop 2", "start 2", "identify 2", "retry 1"} {
		before := e.node.Snapshot(nil)
		if err := e.node.ExecNode(line); !errors.Is(err, core.ErrBusy) {
			t.Errorf("%q = %v; want ErrBusy", line, err)
		}
		if after := e.node.Snapshot(nil); !reflect.DeepEqual(before, after) {
			t.Errorf("%q changed shards", line)
		}
	}
	e.exec(-1, "reset all")
	e.wantState(2, core.Fatal)
	if d := e.diag(0); d.Reconnects != 1 || d.State != core.Starting || !e.conn(0).Attempt.Resume {
		t.Errorf("reset all: shard 0 %v reconnects %d; want STARTING by resume after 1", d.State, d.Reconnects)
	}
	if !strings.Contains(e.events(0), `err="operator reset"`) {
		t.Errorf("reset is not logged like a failure:\n%s", e.events(0))
	}
	// The FATAL shard connects again only after retry.
	n := len(e.tr.Conns())
	e.clk.Advance(time.Hour)
	if len(e.tr.Conns()) != n {
		t.Fatalf("a FATAL shard reconnected without retry")
	}
	e.exec(-1, "retry all")
	e.wantState(2, core.Starting)
	e.exec(-1, "stop all")
	for id := range 4 {
		e.wantState(id, core.Stopped)
	}
	e.exec(-1, "stop all") // already stopped: nothing to do, no error
	e.exec(1, "start")
	e.wantState(1, core.Starting)
	if a := e.conn(1).Attempt; !a.Resume {
		t.Errorf("start after stop did not resume: %+v", a)
	}
	e.exec(1, "start") // running: nothing to do
}

// identify ends the session with close code 1000 and starts a new one; it
// is not a failure, so reconnects do not move.
func TestIdentifyCommand(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	old := e.conn(0)
	e.exec(0, "identify")
	if got := old.Closed(); len(got) != 1 || got[0] != 1000 {
		t.Fatalf("identify closed with %v; want [1000]", got)
	}
	d := e.diag(0)
	if d.Reconnects != 0 || d.SequenceValid || d.Session != "invalid" || e.conn(0).Attempt.Resume {
		t.Fatalf("after identify: %+v; want no reconnect, sequence none, an identify attempt", d)
	}
}

func TestPlanValidate(t *testing.T) {
	for _, tc := range []struct {
		plan core.Plan
		word string
	}{
		{core.Plan{Total: 4, Local: []int{0, 1, 1}}, "shard 1 is named twice"},
		{core.Plan{Total: 4, Local: []int{4}}, "shard 4 is outside 0..3"},
		{core.Plan{Total: 2, Local: []int{0, 1, 2}}, "3 local shards exceed the total of 2"},
		{core.Plan{Total: 0, Local: []int{0}}, "total 0"},
		{core.Plan{Total: 4}, "no local shards"},
	} {
		if err := tc.plan.Validate(); err == nil || !strings.Contains(err.Error(), tc.word) || !strings.Contains(err.Error(), "usage: ") {
			t.Errorf("%+v.Validate() = %v; want an error containing %q and the usage", tc.plan, err, tc.word)
		}
		if _, err := core.New(core.Config{Plan: tc.plan, Transport: &coretest.Transport{}}); err == nil {
			t.Errorf("New accepted %+v", tc.plan)
		}
	}
	ids, err := core.ParseShardList("0-3,7 9")
	if err != nil || !reflect.DeepEqual(ids, []int{0, 1, 2, 3, 7, 9}) {
		t.Errorf("ParseShardList = %v, %v", ids, err)
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "-1", "0-99999999"} {
		if _, err := core.ParseShardList(bad); err == nil {
			t.Errorf("ParseShardList(%q) accepted", bad)
		}
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"reset all", "stop 3 7", "start 0-2", "lease 30s", "lease off", "retry all", "identify 1", "frob", "lease -1s", "reset 1 1", "reset all 3", "lease 1h1m", "stop 0-999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		for _, parse := range []func(string) (core.Command, error){core.ParseCommand, core.ParseShardCommand} {
			c, err := parse(line)
			if err != nil {
				var ce *core.CommandError
				if !errors.As(err, &ce) || !strings.Contains(err.Error(), "usage: ") {
					t.Fatalf("parse(%q) error %v lacks the word and usage", line, err)
				}
				continue
			}
			again, err := parse(c.String())
			if err != nil || !reflect.DeepEqual(again, c) {
				t.Fatalf("parse(%q) = %+v, but its String %q parses to %+v, %v", line, c, c.String(), again, err)
			}
			if c.Verb == core.VerbLease && !c.LeaseOff && (c.Lease < core.MinLease || c.Lease > core.MaxLease) {
				t.Fatalf("parse(%q) accepted lease %v", line, c.Lease)
			}
		}
	})
}

// A refused command shows in the events clipped to its first 128 bytes, on
// a rune boundary: a 64 KiB write is not copied into every log.
func TestRejectedCommandClipped(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.startAll()
	line := "frobnicate " + strings.Repeat("é", 40000)
	if err := e.node.ExecShard(1, line); !errors.Is(err, core.ErrUsage) {
		t.Fatalf("exec of a long unknown command = %v; want ErrUsage", err)
	}
	logged := e.events(1)
	i := strings.Index(logged, "event=rejected cmd=")
	if i < 0 {
		t.Fatalf("no rejection in the events:\n%.300s", logged)
	}
	rest := logged[i:]
	rest = rest[:strings.IndexByte(rest, '\n')]
	if want := `event=rejected cmd=? len=` + strconv.Itoa(len(line)) + ` err="unknown command"`; rest != want {
		t.Errorf("rejected line %.300q; want %q", rest, want)
	}
	if err := e.node.Send(1, []byte(`{"op":8,"d":"`+strings.Repeat("x", 5000)+`"}`)); !errors.Is(err, core.ErrTooLarge) {
		t.Fatalf("oversized send = %v; want ErrTooLarge", err)
	}
	if l := e.events(1); strings.Contains(l, "xxxx") || !strings.Contains(l, ` event=rejected cmd=send op=8 len=5015 err=`) {
		t.Errorf("a refused send is logged with its content, or without its op and length:\n%s", l)
	}
}
