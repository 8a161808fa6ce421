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

// The woken nodes' deliveries and the placement after joins and leaves
// have their lines.
func TestReportWakesAndPlacements(t *testing.T) {
	r := &Report{
		Config: Config{}.withDefaults(),
		Wakes:  []Wake{{Fault: 2, Node: "node1", Lines: 40}, {Fault: 7, Node: "node3", Stale: 3, Copies: 2, Lines: 50, Replayed: 1}},
		Placements: []Balance{
			{Fault: 1, Change: "leave", Members: 2, Min: 8, Max: 8, Moves: 5, Balanced: true, Took: time.Second},
			{Fault: 1, Kind: Kill, Change: "join", Members: 3, Min: 5, Max: 6, Moves: 8, Balanced: true, Took: 2 * time.Second},
			{Fault: 2, Change: "join", Members: 3, Min: 4, Max: 7, Moves: 3, Took: 4 * time.Second},
		},
	}
	table := r.Table()
	for _, want := range []string{
		"Woken from SIGSTOP (2 pauses): the most events a woken node delivered after its deadline 3 (fault 7, node3); the most of its lines on its old sessions that another node delivered too 2; its lines since the stop, new sessions included, 90 in all; replays of another node's lines on sessions it took up after waking 1; sessions the woken nodes held at their stops, by their last lines, 0.",
		"Placement after a leave (the fault took a node away): 1 times, balanced (every member ⌊N/M⌋ or ⌈N/M⌉) 1 times, within 1.0 s median, 1.0 s max; most shards apart (max − min) 0; most moves 5 (⌈N/M⌉ + 1 = 9), over it 0 times.",
		"MOVES OVER ⌈N/M⌉ + 1: fault 1 (kill), join: 8 moves, 3 members, 5 to 6 shards each.",
		"Placement after a join (its repair): 2 times, balanced (every member ⌊N/M⌋ or ⌈N/M⌉) 1 times, within 4.0 s median, 4.0 s max; most shards apart (max − min) 3; most moves 8 (⌈N/M⌉ + 1 = 7), over it 1 times.",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("Table() lacks %q:\n%s", want, table)
		}
	}
}
