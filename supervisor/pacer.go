package supervisor

import (
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
)

// WriteReportWait bounds how long a bucket's next grant waits for the
// report of the previous grant's identify write. A report normally
// follows its grant by a dial, an upgrade and a Hello (milliseconds on a
// working host); one that never comes is a connection that failed before
// its identify, or a child that died. Past the bound the next grant goes
// out with the floor of the last write reported, so an identify written
// more than this after its grant (a discovery, dial and Hello that took
// that long) may reach the gateway too close to the next one of another
// child, which refuses it with op 9: that shard starts again with a new
// slot. Each child's own gateway client still spaces its own identifies.
const WriteReportWait = 15 * time.Second

// FloorPacer is an identify pacer whose grants carry a floor: the moment
// before which the identify must not be written (zero: none). Exec uses
// it when its Pacer is one: the floor travels with the grant to the child,
// whose gateway client holds the identify until then
// (gateway.Config.IdentifyNotBefore), and the child reports each write
// (gateway.Config.IdentifyWritten), which Written takes.
type FloorPacer interface {
	core.IdentifyPacer
	RequestFloor(shard int, operator bool, grant func(notBefore time.Time)) (now bool, notBefore time.Time, cancel func())
	Written(shard int, at time.Time)
}

// SpacedPacer is the identify pacer the children share: the core's
// pacer (its buckets, budget and reserve, as one node), whose grants of
// one Discord bucket carry a floor: the bucket's last identify write a
// child reported, plus Discord's window and the gateway's margin
// (gateway.DefaultIdentifyMargin). That is the spacing one node's gateway
// client keeps between its own writes, kept across the children: a
// grant's identify leaves only once its connection is dialled, upgraded
// and greeted, which differs between connections, so spacing the grants
// alone does not space the writes. The times are wall-clock moments: the
// children run on the parent's host and share its clock.
//
// The grants themselves come at the core's rhythm (5 s a bucket), except
// that a bucket's next grant waits until the previous grant's write is
// reported (or WriteReportWait passed): a floor computed before that
// report would not see the write. Normally the report is back long
// before the core's next grant; when the writes fall a round behind the
// grants (writes 5.05 s apart against grants 5 s apart: after about a
// hundred rounds), the wait keeps a bucket at one round in flight, as one
// node's gateway client holds its identifies. A grant held
// so has left the core pacer's queue: /identify's waiting does not count
// it.
type SpacedPacer struct {
	*core.Pacer
	discord bool
	clock   clock.Clock

	mu        sync.Mutex
	mc        int
	buckets   map[int]*spacedBucket // by shard % mc
	onWritten func()
}

type spacedBucket struct {
	written time.Time         // the last identify write reported
	open    map[int]time.Time // shard → when its grant went out, no write reported yet
	held    []*heldGrant      // the core granted these; they wait for open's reports
	timer   clock.Timer       // at the oldest open grant's WriteReportWait, while some are held
}

type heldGrant struct {
	shard     int
	grant     func(notBefore time.Time)
	cancelled bool
}

// NewSpacedPacer wraps p (discord: whether it paces Discord's buckets).
func NewSpacedPacer(p *core.Pacer, discord bool, c clock.Clock) *SpacedPacer {
	return &SpacedPacer{Pacer: p, discord: discord, clock: clock.Or(c)}
}

// Request is core.IdentifyPacer's, for a caller that cannot pass the floor
// on: its grant comes at the floor.
func (s *SpacedPacer) Request(shard int, operator bool, grant func()) (bool, func()) {
	var (
		mu        sync.Mutex
		cancelled bool
		timer     clock.Timer
	)
	atFloor := func(nb time.Time) bool {
		d := nb.Sub(s.clock.Now())
		if d <= 0 {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		if !cancelled {
			timer = s.clock.AfterFunc(d, grant)
		}
		return false
	}
	now, nb, cancel := s.RequestFloor(shard, operator, func(nb time.Time) {
		if atFloor(nb) {
			grant()
		}
	})
	if now && !atFloor(nb) {
		now = false
	}
	return now, func() {
		mu.Lock()
		cancelled = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// RequestFloor is FloorPacer's.
func (s *SpacedPacer) RequestFloor(shard int, operator bool, grant func(notBefore time.Time)) (bool, time.Time, func()) {
	if !s.discord {
		now, cancel := s.Pacer.Request(shard, operator, func() { grant(time.Time{}) })
		return now, time.Time{}, cancel
	}
	h := &heldGrant{shard: shard, grant: grant}
	now, cancel := s.Pacer.Request(shard, operator, func() {
		if nb, ok := s.admit(h); ok {
			grant(nb)
		}
	})
	var nb time.Time
	if now {
		nb, now = s.admit(h)
	}
	return now, nb, func() {
		s.mu.Lock()
		h.cancelled = true
		s.mu.Unlock()
		cancel()
	}
}

// Written is FloorPacer's: a child wrote shard's identify at at. A time
// ahead of the parent's clock is taken as now: a child's report must not
// hold the others' identifies beyond what a real write would.
func (s *SpacedPacer) Written(shard int, at time.Time) {
	if !s.discord {
		return
	}
	if now := s.clock.Now(); at.After(now) {
		at = now
	}
	s.mu.Lock()
	b := s.bucketLocked(shard)
	if at.After(b.written) {
		b.written = at
	}
	delete(b.open, shard)
	h, nb := s.releaseLocked(b)
	onWritten := s.onWritten
	s.mu.Unlock()
	if h != nil {
		h.grant(nb)
	}
	if onWritten != nil {
		onWritten()
	}
}

// Seed sets each bucket's last write from floor (the last write a
// predecessor process reported for shard's bucket, see
// dir.IdentifyTimes), so that the first grants are spaced from it.
// Call it before the first request; buckets learnt later (a new
// max_concurrency) start without it.
func (s *SpacedPacer) Seed(floor func(shard, maxConcurrency int) time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mc := max(s.Pacer.MaxConcurrency(), 1)
	for key := range mc {
		if w := floor(key, mc); !w.IsZero() {
			b := s.bucketLocked(key)
			if w.After(b.written) {
				b.written = w
			}
		}
	}
}

// Writes returns the last write reported in each bucket, and the
// buckets' count.
func (s *SpacedPacer) Writes() (maxConcurrency int, written map[int]time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	written = map[int]time.Time{}
	for key, b := range s.buckets {
		if !b.written.IsZero() {
			written[key] = b.written
		}
	}
	return s.mc, written
}

// OnWritten makes f run after each write reported (outside the pacer's
// lock): supervise saves the writes with the sessions.
func (s *SpacedPacer) OnWritten(f func()) {
	s.mu.Lock()
	s.onWritten = f
	s.mu.Unlock()
}

// admit grants h now (with its floor) when its bucket has no grant whose
// write is still unreported, else holds it.
func (s *SpacedPacer) admit(h *heldGrant) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.cancelled {
		return time.Time{}, false
	}
	b := s.bucketLocked(h.shard)
	now := s.clock.Now()
	if b.waitingLocked(now) {
		b.held = append(b.held, h)
		s.armLocked(b, now)
		return time.Time{}, false
	}
	return b.grantLocked(h.shard, now), true
}

// bucketLocked returns shard's bucket. A change of max_concurrency
// forgets the history, as the gateway's gate does: the old buckets say
// nothing about the new (grants held in an old bucket still go out on its
// reports or its timer).
func (s *SpacedPacer) bucketLocked(shard int) *spacedBucket {
	mc := max(s.Pacer.MaxConcurrency(), 1)
	if mc != s.mc {
		s.mc, s.buckets = mc, map[int]*spacedBucket{}
	}
	key := shard % mc
	b := s.buckets[key]
	if b == nil {
		b = &spacedBucket{open: map[int]time.Time{}}
		s.buckets[key] = b
	}
	return b
}

// waitingLocked says whether a grant of the bucket's is still waiting for
// its write report (dropping those past WriteReportWait).
func (b *spacedBucket) waitingLocked(now time.Time) bool {
	waiting := false
	for shard, at := range b.open {
		if now.Sub(at) >= WriteReportWait {
			delete(b.open, shard)
		} else {
			waiting = true
		}
	}
	return waiting
}

// grantLocked books a grant of shard and returns its floor.
func (b *spacedBucket) grantLocked(shard int, now time.Time) time.Time {
	b.open[shard] = now
	if b.written.IsZero() {
		return time.Time{}
	}
	return b.written.Add(core.DiscordWindow + gateway.DefaultIdentifyMargin)
}

// releaseLocked takes the first held grant that may go now, booked.
func (s *SpacedPacer) releaseLocked(b *spacedBucket) (*heldGrant, time.Time) {
	now := s.clock.Now()
	for len(b.held) > 0 && !b.waitingLocked(now) {
		h := b.held[0]
		b.held[0] = nil
		b.held = b.held[1:]
		if !h.cancelled {
			nb := b.grantLocked(h.shard, now)
			s.armLocked(b, now)
			return h, nb
		}
	}
	s.armLocked(b, now)
	return nil, time.Time{}
}

// armLocked points the bucket's timer at the moment its oldest open grant
// stops holding the others, while some are held.
func (s *SpacedPacer) armLocked(b *spacedBucket, now time.Time) {
	if len(b.held) == 0 || len(b.open) == 0 {
		if b.timer != nil {
			b.timer.Stop()
		}
		return
	}
	var oldest time.Time
	for _, at := range b.open {
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	d := oldest.Add(WriteReportWait).Sub(now)
	if b.timer == nil {
		b.timer = s.clock.AfterFunc(d, func() { s.expire(b) })
	} else {
		b.timer.Reset(d)
	}
}

func (s *SpacedPacer) expire(b *spacedBucket) {
	s.mu.Lock()
	h, nb := s.releaseLocked(b)
	s.mu.Unlock()
	if h != nil {
		h.grant(nb)
	}
}
