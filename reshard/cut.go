// Package reshard merges the dispatch streams of two plans of one bot
// during a move to a larger plan, so that every dispatch the gateway sent
// to either plan reaches the node's dispatch log once (DESIGN.md section
// 7.5).
//
// # The cut
//
// While a new plan's shards connect, the gateway sends a guild's events to
// the old plan's session of that guild and, from the moment the new plan's
// session for the guild is READY, to that session too (FACTS.md: Discord
// allows sessions of different num_shards side by side "to orchestrate
// zero-downtime scaling"). A cut by local time alone (the
// old plan's events up to the moment the new shard's READY arrives here,
// then the new plan's) is wrong at the edges: the two connections are not
// in step, so an event the gateway sent to both just after the READY can
// arrive on the old connection first (delivered twice), and one sent to
// the old session just before can arrive after it (lost).
//
// Cut instead matches the copies, whenever they arrive. Each event has a
// fingerprint (its type and a 64-bit hash of its d) and Cut keeps
// multisets of them. An old-plan event is delivered at once, as before
// the move, unless it copies a new-plan event already delivered; a
// new-plan event is dropped when it copies an old-plan event already
// delivered, and otherwise held until the switch (the old plan keeps the
// node's stream until then). When an old-plan event copies a held one,
// the held one is cancelled. At the switch (Switch: every new shard is
// READY and the old ones are being closed with 1000) the held events still
// standing are delivered in the order each new shard received them, and
// from then on the new plan's events pass straight through, each still
// checked against the old plan's stragglers (events the old connections
// had in flight when they closed), which are themselves checked against
// what the new plan delivered. An event sent twice with the same d counts
// twice on both sides, so repeats are neither merged nor lost. Nothing
// depends on the two connections' relative speed: a copy is recognised on
// whichever side it comes second, within Config.Window (30 s) of the
// first.
//
// Abort ends a move that will not switch (a new shard went FATAL): the
// held events still standing are delivered as at a switch, so that what
// only the new plan received (the guilds of an old shard that closed 4011,
// which no old session serves any more) is not lost, and the matching goes
// on until Forget, so that an old twin arriving later is not delivered
// again. Only the ending sessions' READY events are not delivered (they
// name sessions that are gone), counted in Stats.Discarded.
//
// What it costs and what it assumes:
//   - The same bytes: a copy is recognised only when both plans' sessions
//     received the same type and byte for byte the same d. That is an
//     assumption, not a documented fact: FACTS.md says Discord runs
//     sessions of different num_shards side by side, not how it encodes
//     one event for two sessions, and nothing about Fluxer running two
//     totals; the simulator sends the same bytes. If a gateway's bytes
//     differed (key order, a field per session), no copy would be
//     recognised: each event sent to both plans during the overlap would
//     appear twice in the dispatch log (a double, never a loss), and
//     Stats.Dropped (the node's /reshard copies_dropped) would stay 0
//     while the overlap lasts, which is how to see it.
//   - Memory: a fingerprint (about 50 bytes with the map's overhead) per
//     old-plan event of the move whose copy has not come (the events of
//     guilds whose new shard is not READY yet, and those sent only to the
//     old plan), until Forget; and the held new-plan events whole, which
//     are only those not yet matched: the new sessions' own READY and
//     GUILD_CREATEs, and copies whose old twin is still on its way. The
//     held bytes are bounded (Config.MaxHeld); past the bound the oldest
//     are delivered early and counted in Stats.Overflow (each one may come
//     twice if its old twin arrives later: counted, never silently).
//   - The events only the new plan received (its READY and the
//     GUILD_CREATEs that follow) are delivered at the switch, after the old
//     plan's events of the overlap: the order per guild of the events both
//     plans received is kept, and a guild's new GUILD_CREATE comes after
//     them. An old-plan straggler that has no copy is delivered after the
//     switch.
//   - Forget ends the bookkeeping once the old connections are closed and
//     the new plan has had time to deliver its copies of what they
//     received (the node calls it DefaultWindow, 30 s, after the switch or
//     the abort); a copy arriving later would be delivered twice.
//   - Two events of the same type and d, one sent only to the old plan and
//     one only to the new, that arrive within the window of each other are
//     taken for twins and one of them is not delivered. Discord's and
//     Fluxer's events carry ids, timestamps or sequence-like fields that
//     make such pairs rare (a member toggling the same presence twice
//     within 30 s across the moment its guild's new shard became READY).
//   - Order per guild needs the old connections to have delivered, by the
//     switch, what the gateway sent them before the last new READY: an
//     old-only straggler is delivered after the switch, after newer
//     events. The node does not prove it: it switches a fixed time
//     (node.SwitchDelay, 1 s) after the last new READY, far longer than
//     two connections to one gateway drift apart, and awaits no heartbeat
//     acknowledgement. Exactly-once does not depend on it.
//   - A 64-bit hash collision between two different events of the move
//     would drop one of them; with a random seed per move the chance for a
//     million events is below one in ten million.
package reshard

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// Event is one dispatch as the gateway delivered it: the shard of its plan,
// its sequence (negative: none, as RESUMED), its type and the raw JSON of
// its d.
type Event struct {
	Shard int
	Seq   int64
	Type  string
	D     []byte
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

// count is how many fingerprints m holds.
func (m multiset) count() (n int) {
	for _, q := range m {
		n += len(q)
	}
	return n
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
