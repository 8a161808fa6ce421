package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// serve against a simulator whose session_start_limit.total is 5, two
// shards, with no discovery before the start (--total 2): shard 0 is
// forced into new sessions (op 9) until only the reserve is left. No
// identify goes beyond the limit, shard 0's diag and /identify say why it
// waits and until when, and shard 1 is untouched.
func TestServeIdentifyBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("identifies 5 s apart, in real time")
	}
	const token = "BUDGET-TOKEN-do-not-print-4321"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2, SessionStartLimit: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	start := time.Now()
	cmd, stderr, root := startServe(t, binDir(t), sim, []string{"SHARDFS_TOKEN=" + token}, "--total", "2", "--backoff", "fixed:100ms")
	eventually(t, "both shards READY", func() (bool, string) {
		s, err := dotlRead(root, "status")
		return err == nil && strings.Count(s, " READY ") == 2, s
	})
	identifies := func() (n int64) {
		for _, st := range sim.AllStats() {
			n += st.Identifies
		}
		return n
	}
	for want := int64(2); want <= 3; want++ {
		sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession})
		eventually(t, fmt.Sprintf("shard 0's identify %d READY", want), func() (bool, string) {
			s, _ := dotlRead(root, "0/state")
			return sim.Stats(0).Identifies == want && s == "READY\n", s
		})
	}
	sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession})
	var diag string
	eventually(t, "shard 0 waiting for the budget", func() (bool, string) {
		diag, _ = dotlRead(root, "0/diag")
		return strings.Contains(diag, "phase wait-identify-budget\n"), diag
	})
	// The simulator's period began with the first identify.
	var until time.Time
	for _, line := range strings.Split(diag, "\n") {
		if v, ok := strings.CutPrefix(line, "identify_wait_until "); ok {
			until, err = time.Parse(time.RFC3339, v)
		}
	}
	if err != nil || until.Before(start.Add(24*time.Hour-time.Second)) || until.After(time.Now().Add(24*time.Hour+time.Minute)) {
		t.Errorf("shard 0's identify_wait_until is %v (%v); want about 24 h and a minute after the start:\n%s", until, err, diag)
	}
	id, _ := dotlRead(root, "identify")
	for _, want := range []string{"total 5\n", "remaining 1\n", "reserve 1\n", "used_24h 4\n", "max_concurrency 2\n", "waiting 1\n", "reset_at " + until.UTC().Format(time.RFC3339) + "\n"} {
		if !strings.Contains(id, want) {
			t.Errorf("/identify lacks %q:\n%s", want, id)
		}
	}
	if n := identifies(); n != 4 {
		t.Errorf("the simulator counted %d identifies; want 4 (5 less the reserve)", n)
	}
	if st := sim.Stats(1); st.Identifies != 1 || st.LiveSessions != 1 {
		t.Errorf("shard 1: %d identifies, %d live sessions; want 1, 1", st.Identifies, st.LiveSessions)
	}
	if d, _ := dotlRead(root, "1/diag"); !strings.Contains(d, "state READY\n") || !strings.Contains(d, "reconnects 0\n") {
		t.Errorf("shard 1 was touched:\n%s", d)
	}
	if ev, _ := dotlRead(root, "events"); !strings.Contains(ev, "event=identify-budget mark=reserve used=4 total=5 remaining=1") {
		t.Errorf("the node's events lack the reserve line:\n%s", ev)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v:\n%s", err, stderr.String())
	}
}

// The budget flags refuse what makes no sense, before any token is read.
func TestServeIdentifyFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--flavor", "discord", "--total", "1", "--identify-total", "-5"}, "--identify-total -5"},
		{[]string{"serve", "--flavor", "discord", "--total", "1", "--identify-reserve", "-2"}, "--identify-reserve -2"},
	} {
		var out, errb strings.Builder
		err := run(context.Background(), tc.args, strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error()+errb.String(), tc.want) {
			t.Errorf("shardfs %v = %v (stderr %q); want an error containing %q", tc.args, err, errb.String(), tc.want)
		}
	}
}
