// Package soak is the failover soak of issue 12: several `shardfs serve
// --etcd` processes share one bot through a real etcd process, against the
// gateway simulator, while faults are injected one after another; after
// each, every shard must be READY on exactly one node within TTL + 10 s,
// the gateway must never hold two live sessions of one shard, and no node
// may send a frame for a shard it does not own.
//
// The CI test (TestSoak) runs 20 faults; bench runs the same Run with 100
// (`go run . -only fleet`). Faults: kill -9 of a node then a restart,
// SIGSTOP of a node past the TTL then SIGCONT, a partition between one node
// and etcd (a Proxy per node, cut past the TTL then healed), kill -9 of
// etcd then a restart on the same data folder and port, and `drain` on a
// node's /ctl then a restart. Kinds come in turn, each round shuffled, so
// that 20 faults hold 4 of each; the node is drawn at random.
//
// Processes. etcd runs in a child process (the harness's own binary
// re-executed with EtcdEnv, see MaybeRunEtcd), so that it can be killed,
// paused and restarted, and the product binary never links an etcd server.
// The nodes are the real binary built from ./cmd/shardfs, read over 9P
// with every operation bounded (a paused node never answers). The
// simulator runs in the harness process.
//
// # The pause subtlety
//
// A SIGSTOPped node's WebSockets stay open at the gateway. Its etcd lease
// expires at the earliest TTL − TTL/3 after the pause (renewals go every
// TTL/3), another node then identifies a new session for each of its
// shards, and the gateway holds two sessions for those shards until it drops
// the zombie on its own heartbeat timeout. The real Discord's timeout is
// about 62 s (1.5 × 41.25 s), longer than any sensible TTL, so on Discord
// the zombie and the new session do coexist for a while: that is a real
// duplicate at the gateway (Discord sends both the same events), harmless
// only because the paused node cannot act on it and, once woken, its
// transport checks its fence before every write.
//
// The soak keeps that situation: the simulator's heartbeat timeout is
// Discord's 62 s, so a paused node's connections stay open through the
// pause and after SIGCONT until the woken node drops them. What it does not
// count as a second session is a connection that is silent: the simulator
// takes a session out of LiveSessions once its client has sent nothing for
// 1.5 heartbeat intervals (gatewaysim Config.QuietAfter; the interval is
// TTL/4, so 3/8 TTL, below the 2/3 TTL the lease lasts at least), and
// counts it again at the next frame on its connection. So the paused
// node's corpse is not a duplicate while it is silent, but a woken node
// that wrote a single frame on an old socket (a heartbeat, a resume) after
// another node took the shard over would make two live sessions of that
// shard, and MaxLiveSessions (the high-water mark the soak checks after
// every fault) would say so. The frame itself reaches the simulator too,
// so the foreign-frame check below sees it as well. Checked by hand on
// 2026-12-02 with the gateway's fence disabled (gateway/fence.go): TestSoak
// failed at its first pause ("two live sessions for one shard", shards 3
// and 4); with the simulator's former 1.125 s heartbeat timeout, which
// dropped a paused node's sockets before its lease could expire, the same
// broken fence passed unnoticed (most live sessions 1).
//
// What the soak checks directly besides the detector is
// everything the node sends after SIGCONT on any connection: the simulator
// reports every client frame (gatewaysim Config.OnFrame), the soak finds
// which node sent it from the client's port through /proc, and a watch on
// the shard keys in etcd says who owned the shard at that moment. A frame
// from a node for a shard the watch did not show it owning, at the frame's
// time or within ownSlack (1 s) after, is a violation; the slack covers the
// watch seeing a key created a little after the node that created it has
// already connected. The answer a client gives to the gateway's own close
// frame is not counted, and a close the client starts gets the slack on
// both sides: a planned move sends it before it deletes the key, but the
// simulator may read it after the watch has seen the deletion (seen once
// in the first 100-fault run, on a loaded machine), and a close cannot
// make a duplicate. After SIGCONT a frame on a connection that never
// named a shard (other than a close) counts too, since the woken node owns
// nothing until it acquires a shard. The same check, without that last
// rule, runs over every frame of the whole soak, not only after SIGCONT;
// the report counts what it saw.
//
// What a woken node delivered. Before a SIGSTOP the soak notes where each
// node's /dispatch ends; once the cluster has recovered from the pause it
// reads what every node appended since, and the woken node's last 256 KiB
// before the stop, whose lines name the sessions it held (the session key
// of each dispatch line). The woken node was stopped past the TTL and its
// shards were READY elsewhere before SIGCONT, so every line it appended on
// one of those sessions came after its deadline: Wake.Stale counts those
// for a message the simulator made after the stop (its id carries the
// time), and Wake.Copies those that another node delivered too,
// recognised by (shard, session key, s) or by the message id. Either is a
// violation (issue 22 item 1: nothing received after the deadline reaches
// dispatch). A line on a session the woken node took up later that
// repeats another node's (a resume's replay, which the tree's reference
// lets a reader drop) is counted apart, not a violation. A message read
// late but made before the stop is not seen: the count is a lower bound
// of what a node without the read fence would deliver.
//
// Placement. After a fault has taken its node away (kill, pause,
// partition, drain: a leave) and after the repair brought it back (a
// join), the soak waits, at most the hang bound, until the watch of the
// shard keys shows every shard held by one of the M members and each
// member within one shard of every other (⌊N/M⌋ or ⌈N/M⌉, DESIGN 7.3; in
// the soak every node may own every shard), and records the spread and
// the moves since the change: acquisitions of a shard key by a node other
// than its last holder. A placement not balanced within the bound is a
// violation; moves past ⌈N/M⌉ + 1 (M after the change) are reported, not
// a violation, since a lease that runs out on a loaded machine moves
// shards for a reason the placement does not control. After an etcd fault
// (nobody came or went) the same is recorded from the fault's start.
//
// Partition. Cut resets every connection and closes the proxy's port (new
// connections are refused) rather than silently dropping packets: the
// node's etcd client then fails fast instead of waiting for its own
// timeouts, which tests the fence, not the client's timeout settings.
//
// etcd kill. etcd stays down for a random TTL/2 to 3·TTL/2, so that some
// outages end before the nodes' deadlines and some after; only recovery is
// timed, since ownership does not move while etcd is down. An outage past
// the deadline fences every node: each rejoins and identifies every shard
// anew (no snapshot was saved). etcd restores every lease with its full TTL
// when it restarts, so the identify slot keys (identify/<bucket>, about 7
// s, never revoked) taken in the recovery just before the kill hold their
// buckets for 7 s more after etcd is back: measured, an etcd kill within a
// few seconds of the previous recovery left the cluster serving again 11–13
// s after etcd's restart, at the edge of the 13 s bound, and over it once in
// 16 faults. The soak therefore waits, before killing etcd, until no
// identify slot key is left (Report.Settle), so that the etcd fault is one
// fault and not a fault during a recovery.
package soak
