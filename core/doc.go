// Package core is the lifecycle core of shardfs: it decides what every local
// shard does next and touches no network, file or process itself.
//
// A Scheduler holds one context per local shard of a Plan. Transport events arrive
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
//   - Identifies wait for the IdentifyPacer; resumes never do. The
//     identify budget is counted down at every slot granted and raised
//     only by a reset the clock has reached, never by a discovery answer,
//     which may lag the identifies in flight (see Pacer). The operator's
//     identify and retry may spend the reserve that automatic new
//     sessions leave; a shard the budget holds back reports phase
//     wait-identify-budget and identify_wait_until.
//   - The session epoch is 0 until the first new session and takes a new,
//     larger value at every new session (never on a resume). It comes from
//     one count for the whole node, at least the Unix time in
//     milliseconds, so that no two shards share one and a restart reuses
//     none (the count runs ahead of the clock only while more than one new
//     session a millisecond starts, far beyond what identify pacing allows).
//   - A panic, in the core or in what it calls (the Transport, the pacer, a
//     connection), is recovered whatever entered the shard (Start, a
//     command, a lease grant, a timer, a link event) and handled like a
//     transient failure, with or without a connection: BACKOFF, then a
//     retry. The shard never reconnects from within that handling, even at
//     a zero delay, so a Transport that panics on every Connect meets a
//     timer, not a recursion. A connection becomes the shard's only once
//     Connect has returned it. A panic in the lease backend (Arm, Off)
//     refuses the lease command, logged with its stack as
//     event=lease-panic in the node's events, and changes no shard.
//   - Nothing connects after Close: a lease grant or a command that
//     arrives later leaves the shard STOPPED.
//
// What each command does, the states that refuse it (ErrBusy when the
// shard was named, skipped under "all"), and where the backoff departs
// from the bare-metal design are stated once, for operators, in the
// tree's reference: doc/shardfs.4.md, sections "Shard commands" and
// "Failures and backoff". The values live in Exponential, ImmediateAfter,
// ReadyReset and MaxFailedResumes; the diag keys and the refusal lines
// (their size, their count per window) are in the same page. Each lease
// command runs alone, from the backend's answer to the shards.
//
// Queued /N/send commands belong to the connection they were accepted on:
// whatever closes it or ends its session drops them with one send-dropped
// line (dropped=N reason=...). A Resume keeps the send history but not the
// queue, which the reset before it wipes.
//
// Sessions that survive a restart (DESIGN.md section 7.1), with
// Config.Sessions set:
//
//   - Scheduler.Start loads every shard's snapshot before the shard's first
//     start, 64 loads at a time, and starts the shards in shard order as
//     their loads end; an operator's start of a shard never started loads
//     it too. A start that will not start a shard (Scheduler.Start of one
//     stopped before it, start all of one its lease keeps stopped) calls
//     the store for nothing. Every store call is bounded (StoreTimeout, 5 s): the core
//     passes a context with that deadline and stops waiting at it, whether
//     or not the store honours the context; an answer that came at the
//     deadline is still taken. A store that hangs on every call delays the
//     last of 1,024 shards by at most 16 bounds. This bound is the one
//     piece of core on real time, not Config.Clock: it bounds real I/O (a
//     hung disk or etcd), and the context handed to the store must carry
//     a deadline the store's own I/O understands. Tests set a short
//     StoreTimeout and use stores that block until the test ends, so no
//     outcome depends on which of two real-time events comes first.
//   - A loaded snapshot is ignored, with one event=snapshot-ignored line
//     (Warn) saying why, when it is of another flavor, used, of another
//     total, has a negative sequence, a saved_at more than SnapshotSkew
//     (5 s) in the future (saved_at is the saver's wall clock, often
//     another node's: within the skew it counts as just saved), is older
//     than the resume window (Config.
//     ResumeWindow; 120 s Discord, 60 s Fluxer), or, for Fluxer, resumes
//     on another endpoint than Config.Gateway (an empty Gateway refuses
//     every Fluxer snapshot). Discord's resume URL is not checked here:
//     the gateway client refuses one outside the discovered gateway's
//     domain. A load that fails, panics or outlives its bound is an
//     event=snapshot-error line at Error. Either way the shard starts a
//     new session and nothing else changes; a store problem never stops a
//     shard.
//   - The order that makes a snapshot resumable at most once: load, check,
//     mark the stored copy used (Save with Session.ID emptied), and only
//     then give the session to the shard, which resumes it. A mark that
//     fails or outlives its bound leaves the shard identifying. A crash at
//     any point after the mark leaves nothing resumable; a crash before it
//     leaves the snapshot, which was not resumed.
//   - A clean stop saves: Close (shutdown) and the stop command (stop all
//     included), after the shard's socket was closed with 4000, when the
//     session and the sequence are both valid, with saved_at the clock's
//     time; stop returns, and Close returns, once the saves have ended
//     (Close saves every shard at once). A failed save is an
//     event=snapshot-error line at Error; one that outlived its bound may
//     have landed, so it counts as saved. Nothing is saved on a failure, a
//     FATAL close, or a lease expiry: an expired lease is not a clean stop,
//     another node may hold the shard by then.
//   - A shard started again in the same process after its stop saved it
//     marks that copy used before resuming, as after a load, and
//     identifies if the mark fails.
//   - Each shard's store calls, and the stop or start they belong to, run
//     one at a time (the shard's store lock), so a stop's save cannot land
//     after the next start's mark.
//   - A shard whose session came from a snapshot keeps epoch 0 and
//     reports session_restored yes and snapshot_age_ms (the age at load)
//     until it next starts a new session. Session IDs never reach the
//     events or diag; only the store holds them.
package core
