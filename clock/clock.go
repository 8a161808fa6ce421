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
// the monotonic part of time.Now.
func Mono(c Clock) time.Duration {
	if m, ok := c.(interface{ Mono() time.Duration }); ok {
		return m.Mono()
	}
	return time.Since(monoOrigin)
}

// monoOrigin carries a monotonic reading, so time.Since(monoOrigin) ignores
// wall-clock steps.
var monoOrigin = time.Now()

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}
