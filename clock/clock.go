// Package clock is the injected time source of shardfs: real time in
// production, a manually advanced fake in tests.
package clock

import "time"

// Clock tells the time and runs functions later. A nil Clock in a config
// means Real.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (Real) or from Advance (Fake)
	// once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call; it reports whether the call was still pending.
	Stop() bool
	// Reset reschedules the call d from now; it reports whether the call was
	// still pending.
	Reset(d time.Duration) bool
}

// Real is the system clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Mono returns c's monotonic reading, a duration since an arbitrary origin
// that a step of the wall clock does not move: Fake.Mono for a Fake, else
// the boot clock (Boot). Deadlines that guard a lease are kept on it.
func Mono(c Clock) time.Duration {
	if m, ok := c.(interface{ Mono() time.Duration }); ok {
		return m.Mono()
	}
	return Boot()
}

// Boot returns the time since an arbitrary origin on a clock that keeps
// counting while the machine is suspended: CLOCK_BOOTTIME on Linux. Go's
// own monotonic reading (CLOCK_MONOTONIC) stands still during a suspend,
// so a lease deadline kept on it would pass late by the whole suspend: a
// node woken after its etcd lease expired would still think it owned its
// shards. Neither clock moves while a VM is stopped (QEMU stop, a frozen
// guest): that case no local clock can see (doc/fleet.md).
func Boot() time.Duration { return boot() }

// monoOrigin carries a monotonic reading, so time.Since(monoOrigin) ignores
// wall-clock steps; the fallback where no boot clock exists.
var monoOrigin = time.Now()

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}
