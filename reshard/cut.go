package reshard

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// Event is one dispatch as the gateway delivered it: the shard of its plan,
// its session key (core.SessionKey), its sequence (negative: none, as
// RESUMED), its type and the raw JSON of its d.
type Event struct {
	Shard   int
	Session string
	Seq     int64
	Type    string
	D       []byte
}

// Sink receives the merged stream: the dispatches to write to the node's
// logs, each once. old tells which plan's shard numbering Shard uses. d is
// not kept after the call.
type Sink func(old bool, ev Event)

// Config configures a Cut.
type Config struct {
	Sink Sink
	// MaxHeld bounds the bytes of new-plan events held before the switch;
	// zero means DefaultMaxHeld.
	MaxHeld int
	// Window is how long an event delivered from one plan is matched
	// against the other's; zero means DefaultWindow.
	Window time.Duration
	Clock  clock.Clock
}

// DefaultMaxHeld is the default bound of the held new-plan events.
const DefaultMaxHeld = 256 << 20

// DefaultWindow is how long an event waits for its twin from the other
// plan by default: far longer than two connections to one gateway drift
// apart, far shorter than the time between two identical events of one
// guild that a bot would care to see twice.
const DefaultWindow = 30 * time.Second

// Stats counts what a Cut did.
type Stats struct {
	Old, New int // events received from each plan
	// Dropped is how many new-plan events were copies of old-plan ones.
	Dropped int
	// Held is how many new-plan events wait for the switch, HeldBytes
	// about their size.
	Held, HeldBytes int
	// Overflow is how many held events were delivered before the switch
	// because MaxHeld was reached, unmatched.
	Overflow int
	// HeldAtSwitch is how many new-plan events were held when Switch (or
	// Abort) released them: the events in flight at the switch.
	HeldAtSwitch int
	// Discarded is how many of the aborted plan's READY events Abort
	// did not deliver (see Abort).
	Discarded int
	Switched  bool
	Aborted   bool
}

type fingerprint struct {
	typ string
	sum uint64
}

// multiset holds fingerprints with the (monotonic) time each was added;
// take and expire remove the oldest first.
type multiset map[fingerprint][]time.Duration

func (m multiset) add(f fingerprint, at time.Duration) { m[f] = append(m[f], at) }

// take removes the oldest f added at or after since and reports whether
// there was one; older ones are forgotten on the way.
func (m multiset) take(f fingerprint, since time.Duration) bool {
	q := m[f]
	for len(q) > 0 && q[0] < since {
		q = q[1:]
	}
	if len(q) == 0 {
		delete(m, f)
		return false
	}
	if len(q) == 1 {
		delete(m, f)
	} else {
		m[f] = q[1:]
	}
	return true
}

type heldEvent struct {
	Event
	f fingerprint
}

// Cut merges one move's two streams. Its methods may be called from any
// goroutine; each plan's events must come in the order each of its shards
// received them.
type Cut struct {
	sink    Sink
	maxHeld int
	window  time.Duration
	clock   clock.Clock
	seed    maphash.Seed

	mu sync.Mutex
	// oldOut and newOut are the events delivered from one plan whose copy
	// from the other has not come yet.
	oldOut, newOut multiset
	// held are new-plan events waiting for the switch, in arrival order;
	// heldBy holds them by fingerprint and cancelled counts those whose
	// old twin was delivered meanwhile (skipped at the switch).
	held                      []heldEvent
	heldBy                    multiset
	cancelled                 map[fingerprint]int
	stats                     Stats
	switched, forgot, aborted bool
}

// New starts the merge of a move: call it before the new plan's first
// shard connects, so that the old plan's events are counted from then.
func New(cfg Config) *Cut {
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = DefaultMaxHeld
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	return &Cut{
		sink: cfg.Sink, maxHeld: cfg.MaxHeld, window: cfg.Window, clock: clock.Or(cfg.Clock), seed: maphash.MakeSeed(),
		oldOut: multiset{}, newOut: multiset{}, heldBy: multiset{}, cancelled: map[fingerprint]int{},
	}
}

func (c *Cut) fingerprint(ev Event) fingerprint {
	return fingerprint{ev.Type, maphash.Bytes(c.seed, ev.D)}
}

// Old takes an event of the old plan.
func (c *Cut) Old(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Old++
	if c.forgot {
		c.sink(true, ev)
		return
	}
	f, now := c.fingerprint(ev), clock.Mono(c.clock)
	switch {
	case c.newOut.take(f, now-c.window):
		c.stats.Dropped++
		return
	case c.heldBy.take(f, now-c.window):
		c.cancelled[f]++
	default:
		c.oldOut.add(f, now)
	}
	c.sink(true, ev)
}

// New takes an event of the new plan.
func (c *Cut) New(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.New++
	if c.forgot {
		c.sink(false, ev)
		return
	}
	f, now := c.fingerprint(ev), clock.Mono(c.clock)
	switch {
	case c.oldOut.take(f, now-c.window):
		c.stats.Dropped++
	case c.aborted && ev.Type == "READY":
		c.stats.Discarded++
	case c.switched:
		c.newOut.add(f, now)
		c.sink(false, ev)
	default:
		ev.D = append([]byte(nil), ev.D...)
		c.held = append(c.held, heldEvent{ev, f})
		c.heldBy.add(f, now)
		c.stats.Held++
		c.stats.HeldBytes += size(ev)
		for c.stats.HeldBytes > c.maxHeld && len(c.held) > 0 {
			c.stats.Overflow++
			c.release()
		}
	}
}

func size(ev Event) int { return len(ev.D) + len(ev.Type) + 32 }

// release takes the first held event off the list and delivers it unless
// its old twin was delivered meanwhile.
func (c *Cut) release() {
	h := c.held[0]
	c.held[0] = heldEvent{}
	c.held = c.held[1:]
	c.stats.Held--
	c.stats.HeldBytes -= size(h.Event)
	if n := c.cancelled[h.f]; n > 0 {
		if n == 1 {
			delete(c.cancelled, h.f)
		} else {
			c.cancelled[h.f] = n - 1
		}
		c.stats.Dropped++
		return
	}
	// Released now, it may still meet its old twin within the window.
	now := clock.Mono(c.clock)
	c.heldBy.take(h.f, 0)
	c.newOut.add(h.f, now)
	c.sink(false, h.Event)
}

// Switch ends the overlap: every new shard is READY and the old ones are
// closing. The held new-plan events still standing are delivered, in
// order; later new-plan events pass straight through.
func (c *Cut) Switch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.switchLocked()
}

func (c *Cut) switchLocked() {
	if c.switched {
		return
	}
	c.switched = true
	c.stats.HeldAtSwitch = len(c.held)
	for len(c.held) > 0 {
		c.release()
	}
	c.held = nil
	c.stats.Switched = !c.aborted
}

// Abort ends the overlap of a move that will not switch: the new plan is
// being ended, the old one keeps the node's stream. The held new-plan
// events still standing are delivered, in order, as Switch would (an
// event the new plan received and the old one did not, because its old
// shard is FATAL or its old twin is still on its way, is not lost; a twin
// arriving later is recognised and not delivered again), except the new
// sessions' READY events, which name sessions that end now: those are
// counted in Stats.Discarded. Until Forget both plans' events are still
// matched against each other.
func (c *Cut) Abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.switched {
		return
	}
	c.aborted, c.stats.Aborted = true, true
	kept := c.held[:0]
	for _, h := range c.held {
		if h.Type != "READY" {
			kept = append(kept, h)
			continue
		}
		c.stats.Held--
		c.stats.HeldBytes -= size(h.Event)
		if n := c.cancelled[h.f]; n > 0 {
			c.cancelled[h.f] = n - 1
			if n == 1 {
				delete(c.cancelled, h.f)
			}
		} else {
			c.heldBy.take(h.f, 0)
		}
		c.stats.Discarded++
	}
	clear(c.held[len(kept):])
	c.held = kept
	c.switchLocked()
}

// Forget ends the matching: the old connections are closed and the new
// plan has delivered its copies of what they received. Both plans' events
// then pass straight through.
func (c *Cut) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.switchLocked()
	c.forgot = true
	c.oldOut, c.newOut, c.heldBy, c.cancelled = nil, nil, nil, nil
}

// Stats returns the counts so far.
func (c *Cut) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
