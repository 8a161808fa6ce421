// Package interop checks gateway/gatewaysim against two Discord client
// libraries that nobody on this project wrote: github.com/bwmarrin/discordgo
// v0.29.0 and github.com/disgoorg/disgo v0.18.15. It is a module of its own
// so that neither library enters shardfs's go.mod. It has tests only.
//
// Each library connects to the simulator's Discord flavour, identifies
// with an explicit shard, reads READY and GUILD_CREATE, receives published
// and generated MESSAGE_CREATEs, and survives op 7 (Drain) and a reset TCP
// connection by resuming, with every published event delivered once and in
// order. Each runs with identify compress true and false.
//
// # Disagreements found and how they were settled
//
// Gateway version (simulator wrong, fixed in gatewaysim). discordgo v0.29.0
// connects with v=9 and the simulator closed 4012 ("You sent an invalid
// version for the gateway"). Discord's API reference (docs/reference.mdx,
// "API Versions") lists 10 and 9 as "Available", 8 to 6 as "Deprecated",
// and warns that only the "Discontinued" ones are "non-functioning". The
// simulator now accepts 9 and 10, speaks v10 on both and reports the
// version asked for in READY's v; it still refuses the deprecated ones,
// whose rules differ, which is stricter than Discord.
//
// RESUMED's sequence (library quirk, worked around). The simulator sends
// RESUMED with "s": null; the Discord docs type s as "?integer" and tell
// clients to "cache the most recent non-null s value for heartbeats, and to
// pass when Resuming". Both libraries store the null as 0 instead: their
// next heartbeat reports 0, and a resume before the next dispatch would ask
// for a replay from the start. The tests assert the heartbeat of 0 and let
// a dispatch arrive after every resume before forcing another disconnect.
//
// Replay before RESUMED (library quirk, harmless). Discord's docs: "the
// Gateway will send the missed events in order, finishing with a Resumed
// event". The simulator does; discordgo logs "Expected READY/RESUMED" when
// the first payload after its resume is a replayed dispatch, then handles
// it normally.
//
// Resume URL (library quirk). discordgo v0.29.0 ignores
// resume_gateway_url and resumes on the discovery URL, which the docs say
// causes "disconnects at a higher rate than normal"; disgo uses it. The
// simulator accepts both; the tests assert which URL each library used.
//
// Compression (simulator gap, allowed by the docs). Both libraries support
// only payload compression (identify "compress": true, their default, each
// binary frame a whole zlib stream); neither v0.29.0 nor v0.18.15 can ask
// for zlib-stream or zstd-stream transport compression. The simulator does
// not implement payload compression and answers such sessions with plain
// text frames, which the docs allow: "even when payload compression is
// enabled, not all payloads will be compressed". Both libraries work with
// compress true and false; their inflate paths are not exercised here.
//
// discordgo v0.29.0 defects (worked around). When a connection dies, both
// its heartbeat goroutine (on a failed write) and its reader (on a failed
// read) call Close and then reconnect. Close is not tied to the connection
// that failed, so the late one can close the freshly resumed connection
// with 1000, which ends the session ("When you close the connection to the
// gateway with close code 1000 or 1001, your session will be
// invalidated"); the next resume then gets op 9, and discordgo identifies
// again at once on the same socket for every op 9 ("your app should
// disconnect ... create a new connection ... then send an Identify"), which
// against the identify limit loops until the send limit closes it 4008. Its
// reconnect loop also outlives Close. Seen with a 1 s heartbeat interval;
// the tests keep Discord's 41.25 s, so discordgo heartbeats only on
// connecting and on request (op 1), and wait for that first heartbeat
// before forcing a disconnect.
//
// disgo v0.18.15 defects (worked around). Its shard manager's Open creates
// shards concurrently into an unguarded map when max_concurrency is above
// 1, so shards are opened one by one with OpenShard and explicit ids. A
// heartbeat tick that coincides with Close, or comes before the first
// READY, dereferences a nil sequence and panics, so its test uses a one-hour
// heartbeat interval and asks for heartbeats with op 1. Its heartbeat
// goroutine stores its own cancel function without synchronisation; when a
// connection ends before that goroutine has run (seen under load), the
// goroutine is never stopped, so the leak check tolerates one per test.
// The same field, LastSequenceReceived and lastHeartbeatSent are data
// races, so under -race its test reruns itself in a child `go test`
// without the race detector. Its default REST rate limiter starts a
// goroutine that never ends; discovery uses the no-op limiter.
package interop
