package gateway

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// DefaultIdentifyMargin is how much later than Discord's 5 s window an
// identify of the same bucket is sent (see identifyGate).
const DefaultIdentifyMargin = 50 * time.Millisecond

// identifyGate spaces the identifies this transport sends in each of
// Discord's buckets (shard % max_concurrency) by at least the identify
// window plus a margin, counted between the moments they are written.
//
// Why: the core's pacer grants a bucket's slots 5 s apart, but an identify
// leaves only once its connection has been dialled, upgraded and greeted,
// which takes a different time for every connection (the first one of a
// node also waits for discovery). Two identifies of one bucket then reach
// the gateway less than 5 s apart whenever the second connection was
// quicker than the first, and Discord refuses the second with op 9: seen
// against the simulator as a third of 256 shards refused at
// max_concurrency 16. Counting from the writes removes the connections'
// differences; the margin covers what remains (the network's delivery
// jitter between two sockets). A startup of N rounds takes N × margin
// longer, 1% with the default.
//
// The gate knows max_concurrency only from discovery: with a configured
// gateway URL, or on Fluxer (no buckets; its pacer spaces identifies), it
// lets every identify through at once.
//
// Across processes (supervise's children share one bucket layout), each
// gate sees only its own writes: notBefore (Config.IdentifyNotBefore)
// gives a floor for a shard's next identify, which reserve honours on top
// of its own spacing, gated or not, and written (Config.IdentifyWritten)
// hears each identify's write, so that whoever grants the slots can
// space them from the writes as this gate does.
type identifyGate struct {
	window, margin time.Duration
	off            bool
	clock          clock.Clock
	notBefore      func(shard int) time.Time
	written        func(shard int, at time.Time)

	mu      sync.Mutex
	users   int               // transports sharing the gate (see Config.ShareIdentifyGate)
	stopped bool              // every transport is closed: arm no timer
	mc      int               // 0: unknown, no gating
	last    map[int]time.Time // bucket → when its latest identify goes out
	// forget empties last once its newest entry is a window and a margin
	// old: none can hold an identify back any more, and a node whose
	// shards all identified keeps no entry per bucket.
	forget clock.Timer
}

// setMaxConcurrency applies discovery's max_concurrency. A change of
// buckets forgets the history: the old buckets say nothing about the new.
func (g *identifyGate) setMaxConcurrency(mc int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if mc != g.mc {
		g.mc, g.last = mc, nil
	}
}

// gateTicket is one reservation: when the identify may go out, and how to
// give the slot back if it never does.
type gateTicket struct {
	key      int
	at, prev time.Time
	held     bool
}

// reserve returns when an identify of shard may be written: the latest of
// now, the shard's floor (notBefore) and the moment its bucket's previous
// identify is a window and a margin old.
func (g *identifyGate) reserve(shard int, now time.Time) gateTicket {
	at := now
	if g.notBefore != nil {
		if floor := g.notBefore(shard); floor.After(at) {
			at = floor
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off || g.mc <= 0 {
		return gateTicket{at: at}
	}
	t := gateTicket{key: shard % g.mc, at: at, held: true}
	if g.last == nil {
		g.last = make(map[int]time.Time)
	}
	if prev, ok := g.last[t.key]; ok {
		t.prev = prev
		if next := prev.Add(g.window + g.margin); next.After(t.at) {
			t.at = next
		}
	}
	g.last[t.key] = t.at
	g.armLocked(t.at.Add(g.window + g.margin).Sub(now))
	return t
}

// wrote reports an identify of shard written at at (Config.IdentifyWritten).
func (g *identifyGate) wrote(shard int, at time.Time) {
	if g.written != nil {
		g.written(shard, at)
	}
}

// armLocked points the forget timer d from now; after Transport.Close it
// arms nothing.
func (g *identifyGate) armLocked(d time.Duration) {
	switch {
	case g.stopped:
	case g.forget == nil:
		g.forget = g.clock.AfterFunc(d, g.forgetAll)
	default:
		g.forget.Reset(d)
	}
}

func (g *identifyGate) forgetAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock.Now()
	var newest time.Time
	for key, at := range g.last {
		if !at.Add(g.window + g.margin).After(now) {
			delete(g.last, key)
		} else if at.After(newest) {
			newest = at
		}
	}
	if len(g.last) == 0 {
		g.last = nil
	} else {
		// A later reservation in another bucket may have moved the timer
		// before this entry's end.
		g.armLocked(newest.Add(g.window + g.margin).Sub(now))
	}
}

// share adds a transport to the gate's users.
func (g *identifyGate) share() *identifyGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.users++
	return g
}

// stop stops the gate's timer once the last transport using it closed.
func (g *identifyGate) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.users--; g.users > 0 {
		return
	}
	g.stopped = true
	if g.forget != nil {
		g.forget.Stop()
	}
}

// release gives back a reservation whose identify was never written,
// unless a later one was made on top of it.
func (g *identifyGate) release(t gateTicket) {
	if !t.held {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last[t.key].Equal(t.at) {
		if t.prev.IsZero() {
			delete(g.last, t.key)
		} else {
			g.last[t.key] = t.prev
		}
	}
}

// newIdentifyGate returns a gate with the given margin; a negative margin
// turns it off.
func newIdentifyGate(c clock.Clock, margin time.Duration) *identifyGate {
	return &identifyGate{window: core.DiscordWindow, margin: max(margin, 0), off: margin < 0, clock: clock.Or(c), users: 1}
}
