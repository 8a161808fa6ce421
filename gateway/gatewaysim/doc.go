// Package gatewaysim is an in-process gateway server for Discord API v10 and
// Fluxer v1, with fault injection, for tests, benchmarks and the demo.
//
// It is a second implementation of the protocol, written from the
// platforms' documentation and sharing no code with package gateway, so that
// a misunderstanding in one cannot hide in both. New starts it on a
// listener; APIURL serves GET /gateway/bot and GatewayURL the WebSocket
// gateway, both over TLS when Config.TLS is set. Publish, PublishGuild, Flood and SetTraffic make events; Inject
// and Drain misbehave; Stats, Totals and Sessions count what happened; Wait
// blocks until a condition on them holds; Config.OnFrame reports every
// message a client sends, with its connection, address and shard. Every
// timer reads Config.Clock.
//
// # Decisions where the documentation is silent
//
// Payloads. A client message over 4,096 bytes, on the wire or (Fluxer)
// after decompression, closes 4002: Discord's Gateway page says payloads
// "must not exceed 4096 bytes" or the connection closes 4002, and Fluxer's
// "Limits and rate limits" page names 4002 "Payload too large". A payload
// that is not one JSON object with an integer "op", or whose d does not fit
// its opcode, closes 4002. An opcode no client sends (0, 7, 9, 10, 11, or
// another flavor's) closes 4001. Presence, voice, member and (Fluxer) lazy
// requests are accepted and ignored once identified; before that they close
// 4003. Each command is judged in this order: decode, send budget, opcode,
// authentication.
//
// Connecting. Discord accepts v=10 and v=9, the versions its API reference
// lists as "Available" (discordgo v0.29.0 connects with v=9), and speaks
// v10's protocol on both; READY's v is the version asked for. The
// "Deprecated" versions 6–8 still work on Discord but have other rules
// (intents were optional before v8); the simulator closes them 4012.
// Discord accepts encoding=json only (ETF closes 4002); Fluxer accepts v=1
// only. Both close 4012 before Hello otherwise. Unknown compress values are
// ignored, as Fluxer's own parser does. Discord's zlib-stream is one deflate
// context with a sync flush per message (each ends 00 00 ff ff); zstd-stream
// is one zstd frame per connection that never ends, each message a flushed
// block, as Discord's page describes. Fluxer's compress=zstd-stream
// compresses what the server sends; adding stream=1 makes client payloads
// one zstd stream too, each message holding whole blocks of exactly one
// payload (one frame per message is accepted as well).
//
// Identify. Rules apply in the order of the close code table: 4005, 4004,
// 4010, 4011, then (Discord) 4013 and 4014, then rate limits. The token may
// carry a "Bot " prefix (discordgo sends one); discovery requires the header
// "Bot TOKEN" on both flavors (Fluxer's page: only the bot token form). A
// missing shard means [0, 1]. With ShardingRequired a total other than
// Shards closes 4010, as Discord does for large bots with a wrong shard
// count. 4011 means more than 2,500 of the bot's guilds route to the shard.
// On Discord, intents are required (v10); bits outside 0–16, 20, 21, 24 and
// 25 close 4013, and a privileged intent in DeniedIntents closes 4014.
// Fluxer ignores intents.
//
// Rate limits. Discord: one identify per bucket (shard % max_concurrency)
// per IdentifyInterval; an excess identify gets op 9 false and the socket
// stays open, so a client may identify on it again (discordgo does).
// session_start_limit.remaining falls with each READY; identifying with
// none left revokes the token and closes every connection 4004, as Discord
// warns it will; SetToken restores it. Fluxer: a rolling budget of 300
// identifies per 60 s; an excess identify is dropped without an answer.
// Every client command counts toward the send budget (120 or 500 per 60 s,
// heartbeats included); one more closes 4008. Fluxer's published source
// counts 600; DESIGN.md's 500 is the default.
//
// Heartbeats. Discord closes 4009 after 1.5 intervals without a heartbeat
// and never asks for one unless told to (HeartbeatRequestAfter or
// FaultHeartbeatRequest). Fluxer asks with op 1 after 37.125 s and closes
// 4009 at 45 s, as its "Limits and rate limits" page says. On Fluxer a
// heartbeat's sequence trims the replay buffer, and one beyond the last
// sequence sent closes 4007; on Discord it is only recorded.
//
// Sessions. A session outlives its connection for ResumeWindow (Discord
// "a few minutes": 3 min; Fluxer 60 s). Closing with 1000 or 1001 from the
// client ends it; any other client close, a dropped connection or a server
// close keeps it, except server closes 4007 and 4009, which tell the client
// to start anew. Resuming an unknown, ended or expired session gets op 9
// false on both flavors and the socket stays open for an identify (Fluxer
// documents this; Discord clients such as discordgo rely on it). A sequence
// beyond the last one closes 4007. Discord replays every missed dispatch or,
// when one is no longer retained, refuses with op 9 false; Fluxer replays
// what it kept, gaps included. RESUMED is a dispatch with a null sequence.
// Resuming a session still attached to another connection moves it and
// closes the old connection 4000. Each session retains at most ReplayLimit
// dispatches, none older than the resume window.
//
// Routing. Guild k has the snowflake GuildID(k) and routes to
// (id >> 22) % total; direct messages go to shard 0. READY lists the
// shard's guilds as unavailable, one GUILD_CREATE each follows (on Discord
// only with the GUILDS intent), and generated MESSAGE_CREATEs reach a
// Discord session only with GUILD_MESSAGES or DIRECT_MESSAGES. Message
// content is not blanked without MESSAGE_CONTENT. Discord's READY carries
// resume_gateway_url ResumeURL, the same host under /resume; Fluxer's has
// none.
//
// Counters are kept per shard id; sessions of the same id with different
// totals share them. SequenceGaps counts the discontinuities a resume left
// the client with (replayed events not following its sequence, or missing
// at the end) and MissedEvents the sequences in them; only Fluxer produces
// them, Discord refuses the resume instead. MaxLiveSessions is the most
// sessions of one shard id attached to connections at the same time: above
// 1 means duplicate sessions existed.
//
// Faults (see FaultKind) are one-shot, except FaultStopAcks and FaultDelay,
// which stay until ClearFaults and apply to later connections of the shard.
// Op 9 from a fault leaves the connection open and unauthenticated. Drain
// sends op 7 to every connection and closes those still open 4000 after
// ReconnectGrace. A connection with MaxQueuedFrames unread frames is
// dropped, its session kept.
//
// Cost. Each connection has one reader goroutine and, only while frames
// are due, one writer goroutine; timers are clock.AfterFunc, and one timer
// generates all traffic. Measured on the project's 2-core machine with
// 16,384 idle READY sessions (TestScale, clients in another process): 17 KB
// of memory and one goroutine per session (6 KB heap, 8 KB stack).
// BenchmarkFlood, with its reading client in the same process, moves
// 200,000–300,000 700-byte events per second over one JSON connection and
// 60,000–150,000 compressed, where the client's inflating and JSON scanning
// take about 60% of the CPU.
package gatewaysim
