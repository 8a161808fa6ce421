package core_test

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// OnFatal names the shard and the close code; End closes every running
// shard with 1000, leaves FATAL ones alone, saves nothing and refuses
// commands after.
func TestOnFatalAndEnd(t *testing.T) {
	var mu sync.Mutex
	var fatal [][2]int
	events := journal.New(1 << 20)
	e := newEnv(t, core.Config{Events: events, OnFatal: func(shard, code int) {
		mu.Lock()
		fatal = append(fatal, [2]int{shard, code})
		mu.Unlock()
	}})
	e.node.Start()
	for id := range 4 {
		e.conn(id).Identify()
		e.conn(id).Link.Ready(core.Session{ID: secretSession}, 1)
	}
	e.conn(1).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errDrop, Code: 4011})
	mu.Lock()
	if !slices.Equal(fatal, [][2]int{{1, 4011}}) {
		t.Fatalf("OnFatal calls = %v; want [[1 4011]]", fatal)
	}
	mu.Unlock()
	if e.node.Events() != events {
		t.Fatal("Events() is not the log Config.Events gave")
	}

	e.node.End()
	for id := range 4 {
		d := e.diag(id)
		switch {
		case id == 1 && d.State != core.Fatal:
			t.Errorf("shard 1 after End: %v; want FATAL kept", d.State)
		case id != 1 && d.State != core.Stopped:
			t.Errorf("shard %d after End: %v; want STOPPED", id, d.State)
		case id != 1 && !slices.Equal(e.conn(id).Closed(), []int{1000}):
			t.Errorf("shard %d after End closed with %v; want [1000]", id, e.conn(id).Closed())
		}
	}
	if err := e.node.ExecNode("start all"); err == nil {
		t.Error("start all after End = nil; want a refusal")
	}
	var buf [1 << 16]byte
	n, _ := events.ReadAt(buf[:], events.Oldest())
	if got := strings.Count(string(buf[:n]), "event=plan-replaced"); got != 3 {
		t.Errorf("%d plan-replaced lines in the events; want 3:\n%s", got, buf[:n])
	}
}

// DispatchDo delivers and counts a dispatch together, and neither once
// the link is stale: a stop that saves the sequence cannot fall between
// the write and the count.
func TestDispatchDoIsAllOrNothing(t *testing.T) {
	e := newEnv(t, core.Config{})
	e.node.Start()
	c := e.conn(0)
	c.Identify()
	c.Link.Ready(core.Session{ID: secretSession}, 1)
	delivered := 0
	c.Link.DispatchDo(2, func() { delivered++ })
	if d := e.diag(0); delivered != 1 || d.Sequence != 2 {
		t.Fatalf("current link: delivered %d, sequence %d; want 1, 2", delivered, d.Sequence)
	}
	if err := e.node.ExecShard(0, "stop"); err != nil {
		t.Fatal(err)
	}
	c.Link.DispatchDo(3, func() { delivered++ })
	if d := e.diag(0); delivered != 1 || d.Sequence != 2 {
		t.Fatalf("after stop: delivered %d, sequence %d; want still 1, 2 (the resume replays 3)", delivered, d.Sequence)
	}
}
