// Package core is the lifecycle core of shardfs: it decides what every local
// shard does next and touches no network, file or process itself.
//
// A Node holds one context per local shard of a Plan. Transport events arrive
// through the Link a shard's current connection was given, operator commands
// through Exec or Apply, lease changes through a Lease backend, and time
// through an injected clock. Every input locks the one shard it concerns, so
// a failure, a reset or a panic in one shard never touches another, and the
// cost of an event does not depend on how many shards the node runs.
//
// The rules (DESIGN.md section 2):
//
//   - Entering BACKOFF: state BACKOFF, reconnects+1, reconnect deadline
//     computed, then the last error and the TCP, TLS and WebSocket states are
//     logged to the shard's events, before the reset wipes them.
//   - A zero reconnect deadline means "the backoff policy decides now".
//   - A reset wipes the shard's transport state only (connection, send
//     queue, heartbeat state, error state, reconnect deadline). The sequence
//     is saved before and restored after only when a session exists, is
//     valid and the saved sequence was valid; otherwise it becomes none and
//     the next start identifies.
//   - After a reset the new connection is made first, then the retry is
//     logged.
//   - A shard connects only while its lease is valid; a lease that expires
//     stops it (STOPPED, reason "lease expired"), and arming the lease again
//     or turning it off starts the shards that the expiry stopped.
//   - Identifies wait for the IdentifyPacer; resumes never do.
//   - The session epoch is 0 until the first new session and takes a new,
//     larger value at every new session (never on a resume). It is the
//     larger of the previous epoch plus one and the Unix time in
//     milliseconds, so that it is not reused after a restart either.
//
// Decisions where DESIGN.md is silent: a command that does not apply to a
// shard's state (reset of a FATAL shard, retry of a READY one) is refused
// with ErrBusy when the shard was named, and skipped when "all" was; stop of
// a stopped shard and start of a running one succeed and do nothing; reset
// of a shard in BACKOFF cuts the wait short without counting another
// reconnect; identify does not count as a reconnect, since nothing failed;
// the default backoff retries the first failure of a resumable session
// within 100 ms (see Exponential), because a resume costs no identify
// budget and sessions expire within minutes; a request to reconnect at once
// (op 7) is honoured at once only from a shard READY for ImmediateAfter
// (5 s), so that a gateway repeating it cannot drive a busy loop; the
// operator's start, retry and identify start the failure count again; each
// lease command runs alone, from the backend's answer to the shards; a
// refused command is logged clipped to 128 bytes.
package core
