package core

import (
	"fmt"
	"log/slog"
)

// A refused token is the bot's failure, not a shard's: the platform
// answers every shard the same (close 4004, discovery's 401 or 403), and
// each further identify spends a start of the daily budget for the same
// answer. Before, shards went FATAL one identify slot at a time (at 1,024
// shards about 85 minutes, each spending a start). Now the first refusal
// sends every shard of the node FATAL at once, with one line in the
// node's events, and no shard asks for a slot until the operator starts
// one again (start, retry or identify on its ctl), which clears the mark.

// tokenRefusal is the first refusal of the node's token.
type tokenRefusal struct {
	shard int
	code  int
	err   error
}

// noteTokenLocked records f, a FATAL failure of s with Failure.Token, as
// the node's token refusal unless one is recorded already.
func (s *shard) noteTokenLocked(f Failure) {
	n := s.node
	n.tokenMu.Lock()
	defer n.tokenMu.Unlock()
	if n.tokenRefused == nil {
		n.tokenRefused = &tokenRefusal{shard: s.id, code: f.Code, err: f.Err}
	}
}

// refusal returns the node's token refusal, nil when none.
func (n *Scheduler) refusal() *tokenRefusal {
	n.tokenMu.Lock()
	defer n.tokenMu.Unlock()
	return n.tokenRefused
}

// sweepToken sends every shard of the node that is not FATAL or STOPPED
// FATAL, once per refusal, and writes the node's one line about it. It
// runs outside every shard's lock (the caller's included).
func (n *Scheduler) sweepToken() {
	n.tokenMu.Lock()
	r := n.tokenRefused
	if r == nil || n.tokenSwept {
		n.tokenMu.Unlock()
		return
	}
	n.tokenSwept = true
	n.tokenMu.Unlock()
	// The line comes first: whoever sees a shard FATAL by the sweep
	// finds why in the node's events.
	now := n.clock.Now()
	e := newEventLine(now, -1, "token-refused", slog.LevelError, n.log)
	e.int("shard", int64(r.shard)).int("code", int64(r.code))
	e.err(r.err)
	e.str("action", "every shard goes FATAL and spends no identify; fix the token, then write retry to the shards (or restart the node)")
	n.events.Append(e.finish(n.log), now)
	e.release()
	for _, s := range n.order {
		s.mu.Lock()
		switch s.state {
		case Fatal, Stopped, Assigned:
			// Not running; a later start connects no more (see
			// tokenRefusedLocked).
		case Backoff:
			// Its reconnect would find the token refused: it starts
			// now and finds it at once (BACKOFF goes FATAL only by way
			// of STARTING).
			s.cancelPendingLocked()
			s.moveLocked(Starting, n.clock.Now())
			fallthrough
		default:
			s.failLocked(s.tokenFailure(r))
		}
		s.unlock()
	}
	if n.onTokenRefused != nil {
		n.onTokenRefused(r.shard, r.code, r.err)
	}
}

// tokenFailure is the FATAL failure of a shard swept by r.
func (s *shard) tokenFailure(r *tokenRefusal) Failure {
	return Failure{Class: FatalFailure, Code: r.code, swept: true,
		Err: fmt.Errorf("the bot's token was refused (shard %d: %w)", r.shard, r.err)}
}

// tokenRefusedLocked goes FATAL instead of asking for an identify slot
// while the node's token stands refused, and reports whether it did.
func (s *shard) tokenRefusedLocked() bool {
	r := s.node.refusal()
	if r == nil {
		return false
	}
	s.failLocked(s.tokenFailure(r))
	return true
}

// clearToken forgets the node's token refusal: the operator starts a
// shard again (a fixed token, or a refusal they judge spurious). The next
// refusal sweeps the node again.
func (n *Scheduler) clearToken() {
	n.tokenMu.Lock()
	defer n.tokenMu.Unlock()
	n.tokenRefused, n.tokenSwept = nil, false
}
