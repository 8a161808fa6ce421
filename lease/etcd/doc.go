// Package etcd shares one bot's shards among several nodes through etcd:
// one lease per node with a self-fencing deadline, shard keys created if
// absent and guarded by their generation, a balanced placement over the
// live members' candidates, and the pacing of planned moves (DESIGN 7.3).
//
// Keys live under /shardfs/<bot>/: plan (JSON {"flavor","total"}, written
// by the first node, compared by every other), members/<node> and
// shards/<id> (value: the node name; a member key of a node that may own
// only some shards is JSON {"node","shards":"0-3,7"}), both attached to
// the node's lease.
// Bot and node names are single key segments (no '/', no spaces), so one
// bot's keys never reach into another's.
//
// Self-fencing. The Member renews with its own KeepAliveOnce loop, never
// the client's KeepAlive stream, so that it knows when each renewal was
// sent: deadline = send time of the last answered renewal + granted TTL −
// 1 s, kept on the monotonic clock (clock.Mono: CLOCK_BOOTTIME, which
// counts a suspend of the machine; the fake clock models a wall step with
// JumpWall, which moves Now but neither Mono nor timers). The core checks
// the wall clock as a second bound at every write and delivery
// (core.Fence), not here: a wall step does not end the membership.
// Renewals are sent every TTL/3, retried every TTL/10 after a failure; each
// try is bounded by TTL/3 of real time because KeepAliveOnce itself retries
// until its context ends. With several endpoints a renewal not answered
// after TTL/10 is sent again, to the next endpoint, while the first try
// goes on (up to three tries; the first answer counts, with its own send
// time): a member cut off from the others, or a follower whose leader was
// just killed, holds a renewal rather than refuse it. Every Get and Txn
// requires a leader and is retried on another endpoint when a member has
// none (RequireLeader; etcd's client retries reads only). When the deadline passes, Done closes: the caller
// stops every owned shard (state STOPPED, reason "lease lost"). A renewal
// answered after the deadline does not revive the membership, since etcd
// may already have deleted its keys and another node may own them; the
// caller closes the Member and joins again, and the shards it acquires then
// have new generations. Close revokes the lease, which deletes the node's
// keys at once (also after a loss, so the others need not wait for etcd's
// expiry).
//
// At steady state a node sends etcd one request per TTL/3, a
// LeaseKeepAlive stream with one send and one answer, whatever the number
// of shards it owns: shard keys ride on the node's lease and are written
// only when ownership changes (TestRenewalCost counts the client's calls).
// The caller gates its shards on Deadline (the core's lease grant) as well
// as on Done, so that traffic stops by the deadline, not shortly after.
//
// Confirmed delivery. No local clock sees a VM frozen by its hypervisor,
// so the deadline alone lets a thawed node deliver what it reads before
// it notices. Member.Confirm (Ownership.Confirm for the current one) is
// one linearizable Get showing whether the node's keys still hold its
// lease; the core (core.Confirmations) shares one such read among every
// event read before it began, at most one in flight, so a node adds one
// read per etcd round trip at most, whatever its event rate. A read that
// finds the keys gone ends the membership as a refused renewal does.
//
// A second process with the same node name cannot join while the first
// one's member key lives (ErrMemberExists): a restarted node waits up to
// the TTL rather than take over keys a paused predecessor may still act on.
//
// Generation = the CreateRevision of shards/<id>. Every etcd write about a
// shard is a Guarded transaction that commits only while that key has that
// CreateRevision; generation 0 is refused because an absent key compares
// equal to it. A shard key naming a node that is not a live member is
// reported by Owners (Live false), not trusted; malformed keys are skipped
// with one log line per version of the key.
//
// Ownership is the loop that runs a node's part (one per node): it joins,
// joins again after a lost membership (new lease, so the shards it takes
// then have new generations), watches members/ and shards/, and on every
// change (queued events coalesce into one read of both folders, and a
// resync every TTL/2 covers a watch that fell behind) compares the
// placement (Place, over the live members' candidates and the keys held)
// with the shard keys. It
// acquires its free shards (32 transactions in flight) and grants each to
// the core (Shards.SetLease) with the membership's Deadline and the key's
// generation, recording the generation first so the snapshot's guarded
// mark-used can commit; it renews the grants from a goroutine of their
// own at every renewal, so that a long reconcile cannot let them lapse;
// it stops at once a shard whose key is no longer its own (deleted by
// hand, or expired in etcd before the local deadline); and it hands over,
// paced by MovePacer (max_concurrency per MoveWindow, the figure
// MaxConcurrencyNow gives when set: discovery's), the shards placed elsewhere: Shards.Handover (stop
// 4000, snapshot saved under the generation's guard), then Release under
// the same guard. A key held by anyone else, a node that is not a live
// member included, is left alone until it goes: an unknown holder may be
// a paused node whose lease etcd has not expired yet. Drain deletes
// members/<node> first, so that the others place the shards without this
// node, hands every shard over, then revokes the lease; the node acquires
// nothing afterwards. A drain's moves spend no identify, whether another
// member takes the shards or nobody does (whoever starts a shard next, the
// other member or this node restarted, resumes from the saved snapshot),
// so they are not paced and a node stops at once (issue 22 item 9); only
// a join's moves are. etcd unreachable at start: Run keeps joining (1 s
// doubling to 10 s) and Status says state waiting with the error; a plan
// mismatch or a malformed plan key ends Run with the error.
//
// An etcd outage costs no identify when nobody else took the shard
// (DESIGN 7.3). A node whose membership was lost keeps, per shard it had
// to stop, the generation prev it held (fencedGen). When it acquires the
// shard again at generation gen, soleOwner reads the key's history from
// prev+1 (a watch from that revision) up to its own create at gen. The
// argument: a node owns a shard only while its key, created by that node
// (create-if-absent), exists; every creation of shards/<id> is a put in
// the key's history. If every event at a revision in (prev, gen) is a
// delete (the old key expiring or revoked), no key of any other node
// existed then, so no other node ran the shard, could resume its session
// or start another; and this node's own traffic stopped at its fencing
// deadline, before etcd could delete the old key. The session in the
// core's memory is therefore the newest of the shard, and the grant says
// so (core.LeaseGrant.Continues): the core resumes it instead of loading
// the stored snapshot (marked used when it was loaded; a lost lease saves
// nothing). A history compacted past prev, an error or a timeout proves
// nothing, and the shard loads its snapshot as after any new generation.
// The proof costs one watch per shard re-acquired after a loss.
//
// Most often the keys never went: the lost membership's revoke failed
// while etcd was down, and an etcd that comes back restores its leases
// with a fresh TTL. Then the next Join (Config.Replaces; the node retries
// every TTL/10 meanwhile, each try bounded by TTL/3 or 2 s, not up to 10 s) moves the member key and the
// node's shard keys still attached to the old lease onto the new one, in
// transactions guarded by the old lease, and revokes the old lease. A Put
// keeps a key's CreateRevision: the generation is unchanged, the core is
// granted the generation it holds and resumes its session, and the other
// nodes, which saw the node's member key all along, never see its shards
// free. The same argument holds: the key existed throughout, so nobody
// else owned the shard. Without this, the first node back revoked or
// outlived its old lease and the others acquired its shards first (the
// three-node soak: 11 identifies for one etcd kill).
//
// Measured (TestOwnershipSteadyStateCost, SHARDFS_STEADY_SHARDS=16384, on
// the 2-core CI kind of machine, in-process etcd): 16,384 shards acquired
// in about 9 s; then 30 renewals cost 30 LeaseKeepAlive requests, 10 read
// transactions (resyncs) and no write.
//
// etcd release: v3.7.3 of go.etcd.io/etcd/client/v3 and server/v3, the
// newest stable release the module proxy serves (3.7.0–3.7.3, beside
// 3.6.13–3.6.16); DESIGN asks 3.5.13 or later. It builds with Go 1.26 and
// the race detector, its embedded server starts in about a second on
// loopback, and go.mod's existing requirements did not move. The tests
// start it in-process (package etcdtest); goleak finds nothing left running
// after a server and its clients are closed, so no goroutine is ignored.
package etcd
