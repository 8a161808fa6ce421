package core

import (
	"fmt"
	"log/slog"
	"time"
)

// Transport opens gateway connections for the core. The gateway package
// implements it over WebSockets; tests use a fake.
type Transport interface {
	// Connect starts one connection attempt for a shard and returns at once:
	// dialling, Hello, Identify or Resume happen elsewhere, and every outcome
	// is reported through l. Connect must not call l's methods before it
	// returns.
	Connect(l *Link, a Attempt) Conn
}

// Conn is one connection attempt, as the core drives it. Its methods must
// not block and must not call the Link synchronously.
type Conn interface {
	// Close ends the connection with a WebSocket close code: 4000 keeps the
	// session resumable, 1000 ends it. Closing twice is harmless.
	Close(code int)
	// Send writes an operator command (already paced by the core).
	Send(payload []byte) error
	// Identify identifies on the open socket after the gateway invalidated
	// the session without closing it (Fluxer's op 9).
	Identify()
}

// Ender is a Conn that says when it has stopped writing for good: the
// channel closes once the connection can write no more (its socket is
// closed, or it never opened). Bytes already in the kernel's send buffer
// may still be on their way, as with any closed socket; the gateway client
// closes only after its close handshake or its 2 s bound. Handover waits
// for it before the shard's key may be released to another node.
type Ender interface {
	Ended() <-chan struct{}
}

// Aborter is a Conn that can close its socket at once, skipping the close
// handshake. Handover calls it when the old connection has not ended
// within HandoverWait, after fencing it, so that the shard's key is
// released only once that connection can write no more.
type Aborter interface {
	Abort()
}

// Attempt says how a connection should start.
type Attempt struct {
	Shard, Total int
	// Resume is set when the connection should resume Session at Sequence;
	// otherwise it identifies afresh.
	Resume   bool
	Session  Session
	Sequence int64
	// LeaseGeneration is the fencing token of the shard's lease when the
	// attempt started.
	LeaseGeneration uint64
	// Fence is the connection's "may write until" deadline: the transport
	// checks it before every write and drops the connection, writing
	// nothing, once it has passed. Nil when no lease is enforced.
	Fence *Fence
	// IdentifyBy, when not zero, is the monotonic reading (clock.Mono) by
	// which the identify of a new session must be written: the pacer's
	// slot spaces this bucket's identifies only if it goes out by then
	// (SlotDeadliner). Past it the transport writes no identify, calls
	// SlotUnused and fails the attempt (transient), so that the shard asks
	// for a slot again.
	IdentifyBy time.Duration
	// SlotUnused gives the slot's start back to the pacer; nil when there
	// is nothing to give back. The transport calls it at most once.
	SlotUnused func()
}

// Session is what a gateway session needs to be resumed. Its ID is a
// secret: the formatting and logging methods never show it.
type Session struct {
	ID        string
	ResumeURL string
}

func (s Session) exists() bool { return s.ID != "" }

// String hides the ID.
func (s Session) String() string {
	if !s.exists() {
		return "session(none)"
	}
	return "session(redacted)"
}

// Format hides the ID from every fmt verb, %#v included.
func (s Session) Format(f fmt.State, _ rune) { fmt.Fprint(f, s.String()) }

// LogValue hides the ID from slog.
func (s Session) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText hides the ID from encoders (JSON included).
func (s Session) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// FailureClass says what a transport failure means for the session.
type FailureClass uint8

// How a failure is handled.
const (
	// Transient: back off and reconnect, resuming when the rule allows.
	Transient FailureClass = iota
	// NewSession: the session is gone (4007, 4009, op 9 false, close 1000):
	// back off and identify afresh.
	NewSession
	// FatalFailure: retrying cannot help (bad token, invalid shard, ...):
	// go FATAL until the operator writes retry.
	FatalFailure
)

var classNames = [...]string{"transient", "new-session", "fatal"}

func (c FailureClass) String() string { return classNames[c] }

// Failure is a classified transport failure.
type Failure struct {
	Class FailureClass
	Err   error
	// Code is the WebSocket close code involved, 0 when none.
	Code int
	// Deadline is when to reconnect. Zero lets the backoff policy decide;
	// a server-requested reconnect (op 7) sets it to now.
	Deadline time.Time
	// Token, with FatalFailure: the platform refused the bot's token
	// (close 4004, or discovery answered 401 or 403). That is the bot's
	// failure, not the shard's: every shard of the node goes FATAL at
	// once, with one line in the node's events, and no shard asks for an
	// identify slot until the operator writes start, retry or identify to
	// one of them.
	Token bool

	// swept marks the FATAL of a shard that the node's token refusal
	// sent there: its line goes to the shard's events only.
	swept bool
}

// Phase is the step a shard's connection is in, for diagnostics.
type Phase uint8

// Connection phases, in the order a connection goes through them.
const (
	PhaseNone     Phase = iota
	PhaseWaitSlot       // waiting for an identify slot
	PhaseDial           // TCP connect
	PhaseTLS            // TLS handshake
	PhaseUpgrade        // WebSocket upgrade
	PhaseHello          // waiting for Hello
	PhaseIdentify       // Identify sent, waiting for READY
	PhaseResume         // Resume sent, waiting for RESUMED
	PhaseReady          // session live
	PhaseBackoff        // waiting for the reconnect deadline
	PhaseStopped        // no connection by decision
	// PhaseWaitBudget is PhaseWaitSlot while the identify budget, not a
	// bucket's pacing, holds the request back; only Diag reports it.
	PhaseWaitBudget
)

var phaseNames = [...]string{"none", "wait-identify-slot", "dial", "tls", "upgrade", "hello", "identify", "resume", "ready", "backoff", "stopped", "wait-identify-budget"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "unknown"
}

// LinkState is the state of one layer of a connection, as the event log and
// diag show it.
type LinkState uint8

// Layer states.
const (
	LayerNone LinkState = iota
	LayerConnecting
	LayerOK
	LayerFailed
	LayerClosed
)

var layerNames = [...]string{"none", "connecting", "ok", "failed", "closed"}

func (s LinkState) String() string { return layerNames[s] }

// ConnState is the state of each layer of a shard's connection.
type ConnState struct {
	TCP, TLS, WS LinkState
}
