package core_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
)

func fmtSprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }

// A shard loses its connection, waits out its backoff and resumes.
func Example_backoffAndResume() {
	clk := clock.NewFake()
	tr := &coretest.Transport{}
	node, _ := core.New(core.Config{
		Plan:      core.Plan{Total: 1, Local: []int{0}},
		Transport: tr,
		Clock:     clk,
		Backoff:   core.Fixed(5 * time.Second),
	})
	defer node.Close()
	show := func(when string) {
		d, _ := node.Diag(0)
		seq := "none"
		if d.SequenceValid {
			seq = fmt.Sprint(d.Sequence)
		}
		fmt.Printf("%-13s %-8s sequence=%s reconnects=%d\n", when, d.State, seq, d.Reconnects)
	}

	node.Start()
	show("start")
	conn := tr.Last(0)
	conn.Link.Ready(core.Session{ID: "secret", ResumeURL: "wss://resume.example"}, 1)
	conn.Link.Dispatch(42)
	show("ready")
	conn.Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("connection reset")})
	show("failed")
	clk.Advance(5 * time.Second)
	next := tr.Last(0)
	fmt.Println("reconnect resumes:", next.Attempt.Resume, "at", next.Attempt.Sequence)
	next.Link.Resumed(43)
	show("resumed")
	// Output:
	// start         STARTING sequence=none reconnects=0
	// ready         READY    sequence=42 reconnects=0
	// failed        BACKOFF  sequence=42 reconnects=1
	// reconnect resumes: true at 42
	// resumed       READY    sequence=43 reconnects=1
}

// Operator commands arrive as text lines, as written to a ctl file.
func ExampleScheduler_ExecNode() {
	node, _ := core.New(core.Config{Plan: core.Range(4, 0, 3), Transport: &coretest.Transport{}, Clock: clock.NewFake()})
	defer node.Close()
	node.Start()
	fmt.Println(node.ExecNode("stop 1 2"))
	fmt.Println(node.ExecNode("frobnicate"))
	for _, d := range node.Snapshot(nil) {
		fmt.Println(d.Shard, d.State)
	}
	// Output:
	// <nil>
	// "frobnicate": unknown command; usage: reset all|ID... | stop all|ID... | start all|ID... | identify all|ID... | retry all|ID... | lease DURATION | lease off
	// 0 STARTING
	// 1 STOPPED
	// 2 STOPPED
	// 3 STARTING
}
