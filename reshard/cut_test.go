package reshard

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
)

// A gateway model: guilds route to old shard g mod N and new shard
// g mod M. Event i of guild g is sent at time t; the old session of g gets
// it if t < close (the old plan's close), the new session if t > ready[j]
// (its READY, which comes with a GUILD_CREATE per guild). Each connection
// delivers in order, each event after a random delay.
type sent struct {
	guild   int
	t       int
	payload string
	newOnly bool
}

type arrival struct {
	at    int
	old   bool
	shard int
	ev    sent
	order int // position on its connection, to keep FIFO among equal times
}

type scenario struct {
	sends    []sent
	arrivals []arrival
	switchAt int
	caughtUp bool // every old-only event arrived before the switch
	window   int
}

func drawScenario(t *rapid.T) scenario {
	oldN := rapid.IntRange(1, 4).Draw(t, "old total")
	newM := rapid.IntRange(oldN+1, 3*oldN+1).Draw(t, "new total")
	guilds := rapid.IntRange(1, 12).Draw(t, "guilds")
	horizon := 1000
	ready := make([]int, newM)
	for j := range ready {
		ready[j] = rapid.IntRange(0, horizon/2).Draw(t, fmt.Sprintf("ready %d", j))
	}
	lastReady := slices.Max(ready)
	maxDelay := rapid.IntRange(0, 300).Draw(t, "max delay")
	var sends []sent
	nEvents := rapid.IntRange(0, 80).Draw(t, "events")
	repeats := map[string][]int{}
	for i := range nEvents {
		g := rapid.IntRange(0, guilds-1).Draw(t, "guild")
		at := rapid.IntRange(0, horizon).Draw(t, "sent at")
		payload := fmt.Sprintf(`{"id":"%d","guild_id":"%d"}`, i, g)
		if rapid.IntRange(0, 4).Draw(t, "repeat") == 0 {
			// The same d sent again, but not within twice the window
			// of another: closer, Cut takes them for twins (see the
			// package doc).
			p := fmt.Sprintf(`{"typing":"%d"}`, g)
			far := true
			for _, u := range repeats[p] {
				far = far && (at-u > 2*window(maxDelay) || u-at > 2*window(maxDelay))
			}
			if far {
				payload = p
				repeats[p] = append(repeats[p], at)
			}
		}
		sends = append(sends, sent{guild: g, t: at, payload: payload})
	}
	for j := range newM {
		sends = append(sends, sent{guild: -1 - j, t: ready[j], payload: fmt.Sprintf(`{"ready":%d}`, j), newOnly: true})
		for g := range guilds {
			if g%newM == j {
				sends = append(sends, sent{guild: g, t: ready[j], payload: fmt.Sprintf(`{"create":%d,"shard":%d}`, g, j), newOnly: true})
			}
		}
	}
	sort.SliceStable(sends, func(a, b int) bool { return sends[a].t < sends[b].t })

	// The switch comes after every READY arrived; the old plan closes
	// there, so it gets what was sent before.
	var arr []arrival
	lastAt := map[[2]int]int{}
	deliver := func(old bool, shard int, s sent) {
		key := [2]int{shard, 0}
		if old {
			key[1] = 1
		}
		at := max(s.t+rapid.IntRange(0, maxDelay).Draw(t, "delay"), lastAt[key])
		lastAt[key] = at
		arr = append(arr, arrival{at: at, old: old, shard: shard, ev: s, order: len(arr)})
	}
	var readyArrived int
	for _, s := range sends {
		if s.newOnly {
			j := s.guild
			if j < 0 {
				j = -1 - j
			} else {
				j = s.guild % newM
			}
			deliver(false, j, s)
			readyArrived = max(readyArrived, lastAt[[2]int{j, 0}])
		}
	}
	switchAt := readyArrived + rapid.IntRange(0, 200).Draw(t, "switch after")
	for _, s := range sends {
		if s.newOnly {
			continue
		}
		// A new session gets what is sent from its READY on, so an
		// event sent at the very instant of both its READY and the
		// switch still reaches one plan (with "after its READY" the
		// model once sent such an event to neither, and the test
		// blamed the Cut for losing it).
		toOld, toNew := s.t < switchAt, s.t >= ready[s.guild%newM]
		if !toOld && !toNew {
			t.Fatalf("model: event %s sent at %d reaches neither plan (switch %d, READY %d)", s.payload, s.t, switchAt, ready[s.guild%newM])
		}
		if toOld {
			deliver(true, s.guild%oldN, s)
		}
		if toNew {
			deliver(false, s.guild%newM, s)
		}
	}
	sort.SliceStable(arr, func(a, b int) bool {
		if arr[a].at != arr[b].at {
			return arr[a].at < arr[b].at
		}
		return arr[a].order < arr[b].order
	})
	caught := true
	for _, a := range arr {
		if a.old && a.ev.t <= lastReady && a.at >= switchAt {
			caught = false
		}
	}
	return scenario{sends: sends, arrivals: arr, switchAt: switchAt, caughtUp: caught, window: window(maxDelay)}
}

// window is the Cut's window in the model: the most two connections drift
// apart, plus one.
func window(maxDelay int) int { return maxDelay + 1 }

func run(sc scenario, c *Cut, fc *clock.Fake) {
	switched := false
	start := fc.Now()
	for _, a := range sc.arrivals {
		fc.Advance(start.Add(time.Duration(a.at) * time.Millisecond).Sub(fc.Now()))
		if !switched && a.at >= sc.switchAt {
			c.Switch()
			switched = true
		}
		ev := Event{Shard: a.shard, Type: "X", D: []byte(a.ev.payload)}
		if a.old {
			c.Old(ev)
		} else {
			c.New(ev)
		}
	}
	c.Switch()
	c.Forget()
}

// TestCutExactlyOnce: whatever the connections' delays, every event sent
// to either plan comes out once (as a multiset: an identical d sent twice
// comes out twice); and when the old connections have caught up by the
// switch, each guild's events come out in the order they were sent.
//
// It holds within the Cut's contract today: byte-identical payloads are
// sent more than two windows apart, so the model draws no closer repeat.
// Closer ones are lost (TestCutFalseTwin, issue 25 item 1).
func TestCutExactlyOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		sc := drawScenario(rt)
		var out []string
		fc := clock.NewFake()
		c := New(Config{Clock: fc, Window: time.Duration(sc.window) * time.Millisecond, Sink: func(_ bool, ev Event) { out = append(out, string(ev.D)) }})
		run(sc, c, fc)

		want := map[string]int{}
		for _, s := range sc.sends {
			want[s.payload]++
		}
		got := map[string]int{}
		for _, p := range out {
			got[p]++
		}
		for p, n := range want {
			if got[p] != n {
				rt.Fatalf("%s: sent %d times, came out %d times (stats %+v)", p, n, got[p], c.Stats())
			}
		}
		for p, n := range got {
			if want[p] == 0 {
				rt.Fatalf("%s came out %d times and was never sent", p, n)
			}
		}
		if !sc.caughtUp {
			return
		}
		// Order per guild of the events that are unique and not a new
		// session's own.
		pos := map[string]int{}
		for i, p := range out {
			pos[p] = i
		}
		last := map[int]int{}
		for _, s := range sc.sends {
			if s.newOnly || want[s.payload] > 1 {
				continue
			}
			if p, ok := last[s.guild]; ok && pos[s.payload] < p {
				rt.Fatalf("guild %d: %s came out before an event sent earlier", s.guild, s.payload)
			}
			last[s.guild] = pos[s.payload]
		}
	})
}

// TestCutFalseTwin: a reaction added on the old plan alone (its guild's
// new shard not READY yet), then, after the switch, removed and added
// again on the new plan: the second add is a new event with the same
// bytes as the first, and comes out. The Cut pairs copies by fingerprint
// within its window, so it takes the second add for the first one's copy
// and drops it.
func TestCutFalseTwin(t *testing.T) {
	t.Skip("known defect, issue 25 item 1: the Cut pairs copies by payload fingerprint within its window, so a byte-identical event repeated within it (a reaction, mute or presence toggle) is dropped as a copy; the redesign of issue 25 un-skips this")
	fc := clock.NewFake()
	var out []string
	c := New(Config{Clock: fc, Sink: func(old bool, ev Event) { out = append(out, fmt.Sprintf("%s %s", ev.Type, ev.D)) }})
	add := Event{Type: "MESSAGE_REACTION_ADD", D: []byte(`{"message_id":"1","user_id":"2","emoji":{"name":"x"}}`)}
	remove := Event{Type: "MESSAGE_REACTION_REMOVE", D: add.D}
	c.Old(add)
	c.Switch()
	fc.Advance(time.Second)
	c.New(remove)
	c.New(add)
	want := []string{
		"MESSAGE_REACTION_ADD " + string(add.D), "MESSAGE_REACTION_REMOVE " + string(add.D), "MESSAGE_REACTION_ADD " + string(add.D),
	}
	if !slices.Equal(out, want) {
		t.Fatalf("delivered %q; want %q", out, want)
	}
}

// TestCutOverflow: past MaxHeld the oldest held events go out early and
// are counted.
func TestCutOverflow(t *testing.T) {
	var out []string
	c := New(Config{MaxHeld: 100, Sink: func(_ bool, ev Event) { out = append(out, string(ev.D)) }})
	for i := range 5 {
		c.New(Event{Type: "X", D: fmt.Appendf(nil, `{"id":"%d","pad":"0123456789"}`, i)})
	}
	st := c.Stats()
	if st.Overflow == 0 || st.Held+st.Overflow != 5 || len(out) != st.Overflow {
		t.Fatalf("after 5 events over a 100-byte bound: stats %+v, %d delivered; want some overflow, the rest held", st, len(out))
	}
	c.Switch()
	if len(out) != 5 {
		t.Fatalf("after Switch: %d delivered; want 5", len(out))
	}
}

// TestCutAbort: an aborted move delivers what only the new plan received
// (its old shard is gone) and each twin once, whichever side it comes on,
// but not the ending sessions' READY.
func TestCutAbort(t *testing.T) {
	fc := clock.NewFake()
	var out []string
	c := New(Config{Clock: fc, Sink: func(old bool, ev Event) { out = append(out, fmt.Sprintf("%v:%s", old, ev.D)) }})
	c.New(Event{Type: "READY", D: []byte(`{"ready":1}`)})
	c.New(Event{Type: "GUILD_CREATE", D: []byte(`{"id":"9"}`)})
	c.Old(Event{Type: "M", D: []byte(`{"id":"1"}`)}) // both plans, old first
	c.New(Event{Type: "M", D: []byte(`{"id":"1"}`)})
	c.New(Event{Type: "M", D: []byte(`{"id":"2"}`)}) // both, old twin still on its way
	c.New(Event{Type: "M", D: []byte(`{"id":"3"}`)}) // only the new plan: its old shard is FATAL
	if st := c.Stats(); st.Held != 4 {
		t.Fatalf("before Abort: %+v; want 4 held", st)
	}
	c.Abort()
	c.Old(Event{Type: "M", D: []byte(`{"id":"2"}`)}) // the twin arrives
	c.New(Event{Type: "M", D: []byte(`{"id":"4"}`)}) // new plan, before its end
	c.Old(Event{Type: "M", D: []byte(`{"id":"4"}`)})
	c.New(Event{Type: "READY", D: []byte(`{"ready":2}`)})
	want := []string{
		`true:{"id":"1"}`, `false:{"id":"9"}`, `false:{"id":"2"}`, `false:{"id":"3"}`, `false:{"id":"4"}`,
	}
	if !slices.Equal(out, want) {
		t.Fatalf("delivered %q; want %q", out, want)
	}
	st := c.Stats()
	if !st.Aborted || st.Switched || st.Discarded != 2 || st.Held != 0 || st.HeldAtSwitch != 3 || st.Dropped != 3 {
		t.Fatalf("stats %+v; want aborted, not switched, 2 READY discarded, 3 released, 3 copies dropped", st)
	}
}
