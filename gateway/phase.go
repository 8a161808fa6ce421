package gateway

import (
	"fmt"

	"github.com/shardfs/shardfs/moveset"
)

// phase is where a connection is in its life. Every change goes through
// conn.setPhaseLocked, under conn.mu, and must be one that phaseMoves
// lists; the reader's hot path reads it without the lock (conn.phase is
// atomic).
//
// The ending is ordered, whoever starts it: a failure is first reported
// (→ failed: the core hears of it once, through Link.Fail), then the close
// is recorded (→ closing: the code the client sends, by Close, which
// report calls after the core's own Close had its chance to win), and
// only then does the reader end (→ ended: sockets closed, timer stopped,
// queue and held identify dropped). A connection closed on purpose skips
// failed: nothing is reported for it.
type phase uint32

const (
	phaseDialing     phase = iota // discovery, TCP, TLS, the WebSocket upgrade
	phaseHello                    // upgraded; waiting for Hello
	phaseIdentifying              // Hello read; identify sent or held by the gate; waiting for READY
	phaseResuming                 // Hello read; resume sent; waiting for RESUMED
	phaseInvalidated              // Fluxer's op 9: open, without a session, until the core calls Identify
	phaseLive                     // READY or RESUMED read
	phaseFailed                   // a failure was reported; Close follows
	phaseClosing                  // Close recorded a code; the reader sends the close frame
	phaseEnded                    // the reader ended and released everything
	numPhases
)

var phaseNames = [numPhases]string{"dialing", "hello", "identifying", "resuming", "invalidated", "live", "failed", "closing", "ended"}

func (p phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint32(p))
}

// phaseSet is a set of phases, one bit each.
type phaseSet = moveset.Set[phase]

func phases(ss ...phase) phaseSet { return moveset.Of(ss...) }

// ending is where any phase before failed may go: a failure, a Close, or
// a panic that ends the reader at once.
var ending = phases(phaseFailed, phaseClosing, phaseEnded)

// phaseMoves lists, for each phase, the phases it may move to: the whole
// life of a connection in one place.
var phaseMoves = [numPhases]phaseSet{
	phaseDialing:     phases(phaseHello) | ending,
	phaseHello:       phases(phaseIdentifying, phaseResuming) | ending,
	phaseIdentifying: phases(phaseLive, phaseInvalidated) | ending,
	// A gateway may answer a resume with op 9 (Fluxer keeps the socket),
	// or with a new session's READY.
	phaseResuming: phases(phaseLive, phaseInvalidated) | ending,
	// Invalidated to invalidated: a second op 9 before the identify.
	phaseInvalidated: phases(phaseIdentifying, phaseInvalidated) | ending,
	// Live to live: a READY on a live socket starts the new session it
	// announces (the core decides what it means).
	phaseLive:    phases(phaseLive, phaseInvalidated) | ending,
	phaseFailed:  phases(phaseClosing, phaseEnded),
	phaseClosing: phases(phaseEnded),
	phaseEnded:   0,
}

// open reports whether the connection has a WebSocket that may still be
// used: upgraded, and neither failed nor closing.
func (p phase) open() bool { return p >= phaseHello && p <= phaseLive }

// handshaking reports whether READY or RESUMED is still awaited after
// Hello.
func (p phase) handshaking() bool {
	return p == phaseIdentifying || p == phaseResuming || p == phaseInvalidated
}

// closing reports whether the client is closing or has closed: what the
// reader checks before handing anything on.
func (p phase) closing() bool { return p >= phaseClosing }
