package soak

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// msgID is a simulator message id made at t.
func msgID(t time.Time, n int) string {
	return fmt.Sprint(uint64(t.UnixMilli()-discordEpoch)<<22 | uint64(n))
}

func line(shard int, s int64, session, id string) string {
	return fmt.Sprintf(`{"shard":%d,"s":%d,"t":"MESSAGE_CREATE","session":%q,"d":{"id":%q,"content":"x"}}`, shard, s, session, id)
}

func TestParseDispatch(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_000)
	text := line(3, 42, "5f0c9a1e27b4", msgID(at, 7)) + "\n" +
		`{"shard":3,"s":null,"t":"RESUMED","session":"5f0c9a1e27b4","d":{}}` + "\n" +
		`{"shard":1,"s":1,"t":"READY","session":null,"d":{"session_id":"never read"}}` + "\n" +
		`{"shard":2,"s":9,"t":"MESS` // cut by a read that raced an append
	got, err := parseDispatch(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("parseDispatch = %d lines; want 3 (the cut one left out)", len(got))
	}
	if d := got[0]; d.shard != 3 || d.s != 42 || d.session != "5f0c9a1e27b4" || d.msg != msgID(at, 7) || !d.posted.Equal(at) {
		t.Errorf("line 0 = %+v; want shard 3, s 42, the session key, the message id made at %v", d, at)
	}
	if _, ok := got[1].event(); ok || got[1].s != -1 {
		t.Errorf("RESUMED = %+v; want no s and no event name", got[1])
	}
	if d := got[2]; d.session != "" || d.msg != "" {
		t.Errorf("READY = %+v; want no session key, no message", d)
	}
	if _, err := parseDispatch("not json\n"); err == nil {
		t.Error("parseDispatch(a whole line that is not JSON) = nil error")
	}
}

// What a woken node delivered after its deadline: lines on the sessions
// it held before the stop, for messages made after the stop (stale), and
// those of them another node delivered too, by (shard, session, s) or by
// message id (copies); a replay on a session it took up after waking is
// counted apart.
func TestWakeDeliveries(t *testing.T) {
	stop := time.UnixMilli(1_800_000_000_000)
	old, taken, mine := "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"
	parse := func(lines ...string) []delivered {
		t.Helper()
		d, err := parseDispatch(strings.Join(lines, "\n") + "\n")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	before := parse(line(0, 10, old, msgID(stop.Add(-time.Second), 1)))
	m1, m2, m3 := msgID(stop.Add(time.Second), 2), msgID(stop.Add(2*time.Second), 3), msgID(stop.Add(3*time.Second), 4)
	// The other node identified a new session for shard 0 (the same
	// messages under another key and s) and delivered shard 1's session
	// bbbb up to s 5.
	others := parse(line(0, 1, taken, m2), line(0, 2, taken, m3), line(1, 5, taken, msgID(stop, 9)))
	for _, tc := range []struct {
		name  string
		after []delivered
		want  Wake
	}{
		{"nothing after waking", nil, Wake{}},
		{"fenced: only its new session's lines", parse(line(2, 1, mine, msgID(stop.Add(9*time.Second), 5))), Wake{Lines: 1}},
		{"a message made before the stop, read late", parse(line(0, 11, old, msgID(stop.Add(-time.Millisecond), 6))), Wake{Lines: 1}},
		{"one stale event nobody else had", parse(line(0, 11, old, m1)), Wake{Stale: 1, Lines: 1}},
		{"stale events the new holder delivered too", parse(line(0, 11, old, m1), line(0, 12, old, m2), line(0, 13, old, m3)), Wake{Stale: 3, Copies: 2, Lines: 3}},
		{"a resume's replay of the other node's line", parse(line(1, 5, taken, msgID(stop, 9)), line(1, 6, taken, msgID(stop.Add(9*time.Second), 10))), Wake{Replayed: 1, Lines: 2}},
	} {
		tc.want.Held = 1
		if got := wakeDeliveries(before, tc.after, others, stop); got != tc.want {
			t.Errorf("%s: wakeDeliveries = %+v; want %+v", tc.name, got, tc.want)
		}
	}
}

func TestOwnersMovesAndCurrent(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	o := &owners{hist: map[int][]ownerChange{
		0: {{at(0), "a"}, {at(5), ""}, {at(6), "b"}},               // a leave: one move
		1: {{at(0), "a"}, {at(5), "a"}},                            // rewritten by its holder: none
		2: {{at(0), "b"}, {at(2), "c"}, {at(7), ""}, {at(8), "c"}}, // a move before from, then c again
		3: {{at(0), "c"}, {at(6), "a"}, {at(7), "c"}},              // away and back: two
	}}
	if got := o.movesSince(at(4)); got != 3 {
		t.Errorf("movesSince(4 s) = %d; want 3", got)
	}
	if got := o.movesSince(at(-1)); got != 8 {
		t.Errorf("movesSince(before all) = %d; want 8 (every first acquisition too)", got)
	}
	if got := strings.Join(o.current(5), ","); got != "b,a,c,c," {
		t.Errorf("current(5) = %q; want b,a,c,c, and none for shard 4", got)
	}
}

func TestPlacedAndMoveBound(t *testing.T) {
	loads, stray := placed([]string{"a", "b", "a", "z", ""}, []string{"a", "b", "c"})
	if loads["a"] != 2 || loads["b"] != 1 || loads["c"] != 0 || stray != 2 {
		t.Errorf("placed = %v, %d stray; want a 2, b 1, c 0, 2 stray (a non-member's and an unowned shard)", loads, stray)
	}
	if lo, hi := spread(loads); lo != 0 || hi != 2 {
		t.Errorf("spread = %d, %d; want 0, 2", lo, hi)
	}
	for _, tc := range []struct{ shards, members, want int }{{16, 3, 7}, {16, 2, 9}, {1024, 3, 343}, {16, 16, 2}} {
		if got := (Balance{Members: tc.members}).MoveBound(tc.shards); got != tc.want {
			t.Errorf("MoveBound(%d shards, %d members) = %d; want %d", tc.shards, tc.members, got, tc.want)
		}
	}
}
