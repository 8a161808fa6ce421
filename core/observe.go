package core

import "time"

// Kinds of lifecycle event that Config.ObserveEvent times.
const (
	EventFail         = "fail"          // Link.Fail
	EventReady        = "ready"         // Link.Ready
	EventResumed      = "resumed"       // Link.Resumed
	EventInvalidated  = "invalidated"   // Link.Invalidated
	EventBackoffTimer = "backoff-timer" // a reconnect deadline fired
	EventLeaseTimer   = "lease-timer"   // a lease deadline fired
	EventIdentifySlot = "identify-slot" // the pacer granted a waiting identify
	EventSendTimer    = "send-timer"    // the send budget released queued commands
)

// EventKinds lists every kind ObserveEvent reports, for exporters that
// prepare one series each.
var EventKinds = []string{EventFail, EventReady, EventResumed, EventInvalidated, EventBackoffTimer, EventLeaseTimer, EventIdentifySlot, EventSendTimer}

// observer times one lifecycle event from the moment it reaches the core
// (before the shard's lock is taken, so that waiting for the lock counts)
// to the moment the core is done with it. It reads the monotonic clock of
// the machine, not the node's Clock: what it measures is the cost of
// handling an event, which a fake clock cannot see. The zero observer
// (no ObserveEvent) costs a nil check.
type observer struct {
	f     func(kind string, d time.Duration)
	kind  string
	start time.Time
}

func (n *Scheduler) observe(kind string) observer {
	if n.observeEvent == nil {
		return observer{}
	}
	return observer{f: n.observeEvent, kind: kind, start: time.Now()}
}

func (o observer) done() {
	if o.f != nil {
		o.f(o.kind, time.Since(o.start))
	}
}
