package core

import (
	"log/slog"
	"time"
)

// MaxPayload is the largest command a gateway accepts, in bytes.
const MaxPayload = 4096

// SendPolicy is a connection's rolling command budget.
type SendPolicy struct {
	Limit   int           // commands per Window the gateway allows
	Window  time.Duration // rolling window
	Reserve int           // part of Limit kept for heartbeats, identify and resume, which are never delayed
	Queue   int           // operator commands that may wait for the budget
}

// The budgets of DESIGN.md section 2. Discord's heartbeat interval of
// 41.25 s needs two heartbeats a minute; one more covers identify or resume,
// and one is margin.
var (
	DiscordSend = SendPolicy{Limit: 120, Window: time.Minute, Reserve: 4, Queue: 64}
	FluxerSend  = SendPolicy{Limit: 500, Window: time.Minute, Reserve: 4, Queue: 64}
)

func (p SendPolicy) commands() int { return max(p.Limit-p.Reserve, 1) }

// sendHistory remembers when the last commands were sent, as a ring of Unix
// nanoseconds that grows on first use: shards that never send pay nothing.
type sendHistory struct {
	times []int64
	head  int // oldest entry once the ring is full
}

// allowAt returns when the next command may go.
func (h *sendHistory) allowAt(now time.Time, p SendPolicy) time.Time {
	if len(h.times) < p.commands() {
		return now
	}
	return later(now, time.Unix(0, h.times[h.head]).Add(p.Window))
}

func (h *sendHistory) record(now time.Time, p SendPolicy) {
	if n := p.commands(); len(h.times) < n {
		h.times = append(h.times, now.UnixNano())
	} else {
		h.times[h.head] = now.UnixNano()
		h.head = (h.head + 1) % n
	}
}

func (h *sendHistory) clear() { *h = sendHistory{} }

// Queued commands belong to the connection they were accepted on. Whatever
// closes that connection or ends its session (a reset or failure, a FATAL
// close, op 9, a new session, stop, lease expiry, shutdown) drops them
// with one send-dropped line saying how many and why: the writer was told
// the command was accepted, so the events log is where it learns that it
// never went out. A Resume keeps the send history, because the budget
// counts what the gateway saw in the last window, but not the queue, since
// the reset before it wipes the send queue (DESIGN.md section 2, reset
// scope); a new session clears both.

// dropSendsLocked drops the queued commands, logging how many and why.
func (s *shard) dropSendsLocked(reason string) {
	if s.sendTimer != nil {
		s.sendTimer.Stop()
	}
	if len(s.transport.sendQ) == 0 {
		s.transport.sendQ = nil
		return
	}
	n := len(s.transport.sendQ)
	clear(s.transport.sendQ)
	s.transport.sendQ = nil
	s.emit(s.line(s.node.clock.Now(), "send-dropped", slog.LevelWarn).int("dropped", int64(n)).str("reason", reason))
}

// dropPendingSendsLocked drops the queue for cancelPendingLocked, which
// every close of the connection goes through; the paths with a more
// precise reason (op 9, stop) have dropped it already.
func (s *shard) dropPendingSendsLocked() {
	switch {
	case s.transport.lastErr == errOperatorReset:
		s.dropSendsLocked("operator reset")
	case !s.sess.valid:
		s.dropSendsLocked("new session")
	default:
		s.dropSendsLocked("connection closed")
	}
}

// newSessionSendsLocked starts a new session's budget and queue.
func (s *shard) newSessionSendsLocked() {
	s.dropSendsLocked("new session")
	s.sess.sends.clear()
}

var stopDropReasons = [...]string{NotStopped: "stopped", StoppedByOperator: "stopped", StoppedByLease: "lease expired", StoppedByShutdown: "shutdown", StoppedByLeaseLost: "lease lost", StoppedByMove: "moved", StoppedNotOwned: "not owned"}

func stopDropReason(why StopReason) string { return stopDropReasons[why] }
