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
