package core

import (
	"strconv"
	"time"
)

// Diag is a snapshot of one shard's diagnostics. Taking it locks that shard
// for a copy and allocates nothing.
type Diag struct {
	Shard int
	State State
	// StateSince is when the shard entered State (zero while ASSIGNED).
	StateSince time.Time
	StopReason StopReason
	Sequence   int64
	// SequenceValid is false when the sequence is none.
	SequenceValid bool
	// Session is "resumable", "invalid" or "none"; never the session ID.
	Session    string
	Epoch      uint64
	Reconnects uint64
	// Attempt is one running count (1-based) of the shard's attempts to
	// get a session, startup and every recovery; 0 only before the shard
	// first starts. During a retry delay it names the attempt that ended.
	// Recovery is set for every attempt after a READY session.
	Attempt  int
	Recovery bool
	// RetryDelay is the wait scheduled on entering BACKOFF, until
	// ReconnectDeadline; Waiting is false when the shard is not waiting.
	RetryDelay        time.Duration
	ReconnectDeadline time.Time
	Waiting           bool
	Phase             Phase
	// IdentifyWaitUntil is, in PhaseWaitBudget, when the identify budget
	// lets the shard's request through.
	IdentifyWaitUntil time.Time
	Conn              ConnState
	Latency           time.Duration
	// HeartbeatMisses counts heartbeats the gateway did not acknowledge
	// in time on the current connection, HeartbeatMissesTotal on every
	// connection of the shard.
	HeartbeatMisses, HeartbeatMissesTotal uint64
	// LastError and LastCode describe the failure that the next reset will
	// wipe.
	LastError    error
	LastCode     int
	Lease        LeaseGrant
	LeaseExpired bool
	Identifies   uint64
	Resumes      uint64
	Dispatches   uint64
	ReadySince   time.Time
	SendQueued   int
	// Restored is set while the session is one loaded from the session
	// store, until the shard next starts a new session; SnapshotAge is
	// the snapshot's age when it was loaded.
	Restored    bool
	SnapshotAge time.Duration
}

func (s *shard) diag(now time.Time) Diag {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := Diag{
		Shard: s.id, State: s.state, StateSince: s.since, StopReason: s.stopReason,
		Sequence: s.sess.seq, SequenceValid: s.sess.seqValid,
		Session: "none", Epoch: s.sess.epoch, Reconnects: s.reconnects,
		Attempt: s.attempt, Recovery: s.recovery,
		Phase: s.transport.phase, Conn: s.transport.connState, Latency: s.transport.latency,
		HeartbeatMisses: s.transport.hbMisses, HeartbeatMissesTotal: s.hbMissesTotal,
		LastError: s.transport.lastErr, LastCode: s.transport.lastCode,
		Lease: s.lease, LeaseExpired: s.leaseExpire,
		Identifies: s.identifies, Resumes: s.resumes, Dispatches: s.dispatches,
		SendQueued: len(s.transport.sendQ),
		Restored:   s.store.restored, SnapshotAge: s.store.restoredAge,
	}
	if s.sess.session.exists() {
		d.Session = "invalid"
		if s.sess.valid {
			d.Session = "resumable"
		}
	}
	if s.transport.phase == PhaseWaitSlot && s.slotCancel != nil {
		if until := s.node.pacer.BudgetWait(s.slotOperator); !until.IsZero() {
			d.Phase, d.IdentifyWaitUntil = PhaseWaitBudget, until
		}
	}
	if s.state == Backoff {
		d.RetryDelay, d.ReconnectDeadline, d.Waiting = s.transport.delay, s.transport.deadline, true
	}
	if s.state == Ready {
		d.ReadySince = s.readySince
	}
	return d
}

// AppendText appends the diagnostics as "key value" lines, the format of a
// shard's diag file.
func (d *Diag) AppendText(b []byte, now time.Time) []byte {
	kv := func(k, v string) {
		b = append(b, k...)
		b = append(b, ' ')
		b = append(b, v...)
		b = append(b, '\n')
	}
	num := func(k string, v int64) {
		b = append(b, k...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, v, 10)
		b = append(b, '\n')
	}
	num("shard", int64(d.Shard))
	kv("state", d.State.String())
	if !d.StateSince.IsZero() {
		num("state_age_ms", max(now.Sub(d.StateSince), 0).Milliseconds())
	}
	if d.State == Stopped {
		kv("stop_reason", d.StopReason.String())
	}
	if d.SequenceValid {
		num("sequence", d.Sequence)
	} else {
		kv("sequence", "none")
	}
	kv("session", d.Session)
	num("epoch", int64(d.Epoch))
	num("session_epoch", int64(d.Epoch))
	if d.Restored {
		kv("session_restored", "yes")
		num("snapshot_age_ms", d.SnapshotAge.Milliseconds())
	} else {
		kv("session_restored", "no")
		kv("snapshot_age_ms", "none")
	}
	num("reconnects", int64(d.Reconnects))
	num("attempt", int64(d.Attempt))
	if d.Recovery {
		kv("recovery_phase", "recovery")
	} else {
		kv("recovery_phase", "startup")
	}
	if d.Waiting {
		num("retry_delay_ms", d.RetryDelay.Milliseconds())
		kv("reconnect_deadline", d.ReconnectDeadline.UTC().Format(time.RFC3339Nano))
	} else {
		kv("retry_delay_ms", "none")
		kv("reconnect_deadline", "none")
	}
	kv("phase", d.Phase.String())
	if !d.IdentifyWaitUntil.IsZero() {
		kv("identify_wait_until", d.IdentifyWaitUntil.UTC().Format(time.RFC3339))
	}
	kv("tcp", d.Conn.TCP.String())
	kv("tls", d.Conn.TLS.String())
	kv("ws", d.Conn.WS.String())
	num("latency_ms", d.Latency.Milliseconds())
	num("heartbeat_misses", int64(d.HeartbeatMisses))
	num("heartbeat_misses_total", int64(d.HeartbeatMissesTotal))
	if d.LastError != nil {
		b = append(b, "last_error "...)
		b = strconv.AppendQuote(b, d.LastError.Error())
		b = append(b, '\n')
	} else {
		kv("last_error", "none")
	}
	num("last_close_code", int64(d.LastCode))
	if d.Lease.Deadline.IsZero() {
		kv("lease", "off")
	} else {
		kv("lease", "armed")
		kv("lease_deadline", d.Lease.Deadline.UTC().Format(time.RFC3339Nano))
		num("lease_remaining_ms", max(d.Lease.Deadline.Sub(now), 0).Milliseconds())
	}
	kv("lease_expired", strconv.FormatBool(d.LeaseExpired))
	num("lease_generation", int64(d.Lease.Generation))
	if d.Lease.Owner && d.Lease.Generation != 0 {
		num("owner_generation", int64(d.Lease.Generation))
	} else {
		kv("owner_generation", "none")
	}
	num("identifies", int64(d.Identifies))
	num("resumes", int64(d.Resumes))
	num("dispatches", int64(d.Dispatches))
	if !d.ReadySince.IsZero() {
		kv("ready_since", d.ReadySince.UTC().Format(time.RFC3339Nano))
	}
	num("send_queued", int64(d.SendQueued))
	return b
}
