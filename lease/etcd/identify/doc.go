// Package identify is the core.IdentifyPacer for several nodes that share
// one Discord bot through etcd (DESIGN 7.3, "Identify across nodes").
//
// Buckets. A shard's bucket is shard % max_concurrency. A node may hand
// out a slot of bucket b only after it created <prefix>identify/<b> in a
// transaction that requires the key absent (CreateRevision 0). The key
// rides on its own etcd lease of KeyTTL (default 7 s), granted just before
// the transaction and never revoked, so the key lives at least KeyTTL less
// the transaction's own latency, and a node that crashes holding it can
// only lengthen the gap: the others wait for etcd to expire it. A lease
// granted for an attempt etcd refused is attached to nothing and is
// revoked at once; after a create whose answer was lost (it may have
// committed) nothing is granted and nothing revoked.
//
// The holder's 1.5 s. The slot is the node's for Hold (default 1.5 s)
// from the moment the lease grant was sent (injected clock): within it the
// pacer calls the grant of the oldest local waiter of that bucket (an
// operator's first), or, if every waiter was cancelled meanwhile, answers
// the next Request of that bucket with now = true. After Hold the slot is
// lost for this node; the key stays until it expires, so nobody else uses
// it either. The hold is judged on that clock only: the attempt's etcd
// calls are bounded by a few seconds, not cut off at Hold, so that a slow
// create has a known outcome; when the lease grants already took the
// hold, no create is sent and the worker tries again at once.
//
// Spacing, and what "identify within 1.5 s of the slot" (DESIGN 7.3)
// means here. The pacer bounds when the grant is handed out (within Hold
// of the slot's start), not when the identify reaches the gateway: after
// the grant the core dials, waits for Hello and sends the identify (or
// sends it at once on a socket already open), and the pacer cannot see
// that. The next slot of the bucket, on any node, starts no earlier than
// KeyTTL after this one started (the key's lease is granted at the start
// and etcd never expires a lease early). So with g the grant's delay after
// its slot's start (at most Hold, in practice a few etcd round trips) and c
// the time from the grant to the identify on the wire, two identifies of
// one bucket are at least KeyTTL − (g₁ + c₁) + (g₂ + c₂) apart: at least
// 7 − 1.5 − c₁ + c₂ ≥ 5 s with the defaults whenever c₁ − c₂ ≤ 0.5 s, and
// ≥ 5 s whenever c₁ − c₂ ≤ about 2 s when the grants come promptly (the
// usual case). It is the difference of two dial-and-Hello times that
// matters, not their size: both identifies pay one. It could break when
// one identify's dial was slow by seconds (CPU starvation, a short
// SIGSTOP) and the next one's fast. So each slot carries an identify-by
// deadline (core.SlotDeadliner: IdentifyBy, KeyTTL − 5 s after the slot's
// start, 2 s with the defaults, at least Hold) into the core's attempt,
// and the gateway client writes no identify past it: it gives the slot's
// start back (as a lost slot does) and fails the attempt, and the shard
// asks for a new slot. Every identify then goes out within KeyTTL − 5 s of
// its slot's start, and the next slot of its bucket starts KeyTTL after
// it at the earliest: 5 s apart whatever the dials do
// (gateway TestIdentifyByDeadline, TestIdentifyBy here).
// Measured: two nodes, max_concurrency 1, 32 shards against a simulator
// refusing an identify within 5 s (node TestFleetIdentifyAcrossNodes):
// none refused.
//
// Release. Left to its lease, a bucket gives one identify per KeyTTL and
// etcd's expiry check (7.5 s), where Discord allows one per 5 s: 1,024
// shards at max_concurrency 16 took 64 × 7.5 s. So the node reports each
// identify's write (Written, gateway.Config.IdentifyWritten) and the
// pacer revokes that slot's key lease 5 s + ReleaseMargin (0.5 s) after
// the write, on its own clock: the next slot of the bucket, on any node,
// starts only once the key is gone, so the two identifies are 5.5 s apart
// as measured from the end of the first write (TestWrittenFreesBucket).
// A node that dies before the release, or an identify never written,
// leaves the key to its lease, as before. Measured: 128 shards at
// max_concurrency 16 on one node READY in 40 s (16 every 5.6 s) where
// they took 58 s; 1,024 in 5m57s; none refused by the simulator (node
// TestFleetDiscordStart).
//
// Waiting. Requests wait in one FIFO per bucket on each node (operators'
// requests ahead of the automatic ones) and a worker per bucket tries to
// acquire while its queue is not empty; a node's workers take turns at an
// attempt, since every attempt writes the one counter and only one could
// win a round. Request never talks to etcd and
// never blocks on it: it is called under a shard's lock. The worker
// retries when the node's watch on <prefix>identify/ reports the bucket
// key (or the budget counter) deleted, and at the latest after Retry
// (default 1 s) in case an event was missed or the watch is down. A failed
// etcd call is logged ("identify: ...", with the bucket) and retried after
// Retry; no slot is ever granted without the key created by this node.
//
// Budget. The daily session start budget is the counter key
// <prefix>identify/starts, value "USED RESET_UNIX_MS", on a lease that
// expires at RESET (so the count is raised only when etcd's clock reaches
// the reset: the key then disappears and the next slot starts a new
// period). The transaction that creates a bucket key also writes the
// counter, guarded by the counter's ModRevision (or its absence), so two
// nodes never both spend the last start. A start is counted when the key
// is created; a slot lost after its hold gives it back (one off the
// counter of its period, guarded by the ModRevision read), since no
// identify goes out on it: on a loaded machine, lost slots otherwise spend
// the budget until the automatic requests stop. The total is discovery's (SetStartLimit),
// capped by Config.Ceiling (--identify-total) when set, as core.Pacer's.
// Until the first answer it is Config.Total (default Discord's documented
// 1000, which also stays when there is no discovery, --gateway), enforced
// from the first slot, unlike core.Pacer, which only counts until it knows
// the figure: N nodes cannot each assume the budget is theirs. Automatic
// requests never take the counter past Total - Reserve (default 1% of the
// total, at least 1, less than the total); an operator's may go to Total.
// SetStartLimit takes Discord's session_start_limit: it sets the total
// (capped) and may raise the used count (total - remaining, until now +
// reset_after), never lower it nor move a counter's reset: a lagging
// answer counts nothing back. The period is etcd's, never a node's clock
// (DESIGN 7.3): the counter counts for as long as etcd holds it, and the
// period ends when etcd expires its lease (granted for the period's length,
// a duration measured on one node's clock, so skew does not enter). RESET
// is the writer's guess of the end, shown in /identify and used by
// BudgetWait, no more: a node whose clock runs a day ahead cannot start a
// new period early (TestSkewedClockCannotRestartPeriod; before, it took the
// counter for yesterday's and spent the budget again). The price: etcd
// gives a lease its full TTL back when it restarts or changes leader,
// unless the cluster runs with lease checkpoints (etcd 3.6:
// --feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true; 3.5:
// --experimental-enable-lease-checkpoint and
// --experimental-enable-lease-checkpoint-persist), so without them a leader
// change can lengthen the current period by up to a day: fewer starts,
// never more; and a node whose clock is behind waits (BudgetWait) its
// skew longer for the new period. An operator who knows the gateway's period ended may delete
// <prefix>identify/starts by hand. A new counter starts at
// that used count, its reset at the answer's reset, or a day and a minute
// after its first slot when none is known. BudgetWait answers from the counter last seen (read
// or watched), in memory.
//
// A changed max_concurrency (SetStartLimit) re-buckets this node's waiting
// requests in their order; every node learns it from its own discovery,
// and until they all have, two nodes may map one shard to two buckets.
//
// Place: under lease/etcd, where DESIGN puts the etcd code, but a package
// of its own because it needs no Member, only a client and the bot's
// prefix (etcd.Prefix), and so that the node's lease code stays apart from
// the pacing.
//
// Not covered: slots granted in the last minute before a reset may reach
// the gateway in its new period (core.Pacer carries them over); across
// nodes the counter does not, and only the reserve stands between them and
// a refused identify. Fluxer's budget is not paced here (Fluxer has no
// buckets; use core.Pacer per node with a share of the budget).
package identify
