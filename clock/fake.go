package clock

import (
	"container/heap"
	"sync"
	"time"
)

// Fake is a Clock that moves only when Advance is called. Timers fire in
// deadline order from the goroutine that calls Advance, with Now set to
// their deadline, so a test sees every intermediate state. It is safe for
// concurrent use; callbacks may create, stop and reset timers.
type Fake struct {
	mu     sync.Mutex
	now    time.Time     // the monotonic reading, which timers follow
	wall   time.Duration // added to now by Now: a wall clock stepped by JumpWall
	seq    uint64        // breaks ties so that equal deadlines fire in creation order
	timers fakeHeap
}

// Epoch is the time a Fake created by NewFake starts at.
var Epoch = time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)

// NewFake returns a fake clock reading Epoch.
func NewFake() *Fake { return &Fake{now: Epoch} }

// Now returns the fake wall time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Add(c.wall)
}

// Mono returns the fake monotonic reading: the time advanced since Epoch,
// which JumpWall does not change.
func (c *Fake) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Sub(Epoch)
}

// JumpWall steps the wall clock by d (either way), as an operator or NTP
// setting the time does; timers and Mono are not moved, as on a real
// system whose monotonic clock ignores the step.
func (c *Fake) JumpWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall += d
}

// AfterFunc schedules f at Now()+d. A d of zero or less fires at the next
// Advance, never from within AfterFunc.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, f: f, index: -1}
	c.schedule(t, d)
	return t
}

// Advance moves the clock forward by d, firing every timer that falls due,
// in order. Timers scheduled by the callbacks fire too when they fall due
// within d.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for len(c.timers) > 0 && !c.timers[0].when.After(end) {
		t := heap.Pop(&c.timers).(*fakeTimer)
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	if end.After(c.now) {
		c.now = end
	}
	c.mu.Unlock()
}

// Pending returns the number of scheduled timers.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next returns the time until the earliest pending timer, and false when
// none is pending.
func (c *Fake) Next() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	return c.timers[0].when.Sub(c.now), true
}

func (c *Fake) schedule(t *fakeTimer, d time.Duration) {
	if d < 0 {
		d = 0
	}
	c.seq++
	t.when, t.seq = c.now.Add(d), c.seq
	heap.Push(&c.timers, t)
}

type fakeTimer struct {
	c     *Fake
	f     func()
	when  time.Time
	seq   uint64
	index int // position in the heap, -1 when not pending
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.timers, t.index)
	return true
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	pending := t.index >= 0
	if pending {
		heap.Remove(&t.c.timers, t.index)
	}
	t.c.schedule(t, d)
	return pending
}

type fakeHeap []*fakeTimer

func (h fakeHeap) Len() int { return len(h) }
func (h fakeHeap) Less(i, j int) bool {
	if h[i].when.Equal(h[j].when) {
		return h[i].seq < h[j].seq
	}
	return h[i].when.Before(h[j].when)
}
func (h fakeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *fakeHeap) Push(x any) {
	t := x.(*fakeTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *fakeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
