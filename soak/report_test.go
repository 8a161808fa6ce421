package soak

import (
	"strings"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	r := &Report{
		Config:   Config{}.withDefaults(),
		Faults:   map[Kind]int{Kill: 2},
		Failover: map[Kind][]time.Duration{Kill: {4 * time.Second, 3 * time.Second}},
		Recovery: map[Kind][]time.Duration{Kill: {2 * time.Second, 5 * time.Second}},
		Sessions: map[Kind]Sessions{Kill: {Identifies: 11, Resumes: 10}},
		MaxLive:  1,
	}
	table := r.Table()
	for _, want := range []string{"| kill -9 of a node", "| 2 | 3.0 s / 4.0 s / 4.0 s | 13.0 s | 5.0 s / 5.0 s | 11 / 10 |", "TTL 3s, simulator heartbeat 750ms"} {
		if !strings.Contains(table, want) {
			t.Errorf("Table() lacks %q:\n%s", want, table)
		}
	}
	if err := r.Err(); err != nil {
		t.Errorf("Err() of a clean report = %v", err)
	}
	r.MaxLive = 2
	r.ForeignFrames = []string{"x"}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "max live sessions of one shard 2") || !strings.Contains(err.Error(), "did not own: x") {
		t.Errorf("Err() = %v; want the duplicate and the foreign frame", err)
	}
}

// The etcd member faults appear in the table only when they ran, and the
// report says the identifies per etcd fault; an identify during a fault
// that left etcd a quorum is a violation (recorded by Run).
func TestReportClusterKinds(t *testing.T) {
	r := &Report{
		Config:   Config{EtcdMembers: 3}.withDefaults(),
		Faults:   map[Kind]int{EtcdKill: 2, LeaderKill: 4},
		Recovery: map[Kind][]time.Duration{EtcdKill: {time.Second}, LeaderKill: {time.Second}},
		Sessions: map[Kind]Sessions{EtcdKill: {Identifies: 3, Resumes: 30}, LeaderKill: {}},
		MaxLive:  1,
	}
	table := r.Table()
	for _, want := range []string{"| kill -9 of the etcd leader", "Identifies per etcd fault: etcd 1.5 (3 over 2), leader 0.0 (0 over 4).", "etcd members 3"} {
		if !strings.Contains(table, want) {
			t.Errorf("Table() lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "member that does not lead") {
		t.Errorf("Table() lists a kind that did not run:\n%s", table)
	}
}
