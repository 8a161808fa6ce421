// Package gateway is the client that keeps one WebSocket session per shard
// to the Discord v10 or Fluxer v1 gateway, implementing core.Transport over
// gorilla/websocket.
//
// A Transport opens a connection whenever the core asks (Connect): it
// discovers the gateway URL (GET {api}/gateway/bot, cached and shared, or a
// configured URL), dials, upgrades, waits for Hello, identifies or resumes,
// heartbeats, hands every dispatch to a Sink, and reports the outcome —
// phases, layer states, READY, RESUMED, sequences, latency and classified
// failures — through the connection's core.Link. The core decides what
// happens next; this package only says what happened.
//
// # How failures are classified
//
// Every way a connection can end is one of the core's failure classes; the
// core then closes with 4000 (the session stays resumable) or 1000, backs
// off, and resumes or identifies. Close codes follow DESIGN.md section 3
// (ClassifyClose).
//
//	cause                                              class          notes
//	close 4004 4010 4011 4012                          fatal          bad token, shard, sharding, version;
//	                                                                  4004 is the bot's (Failure.Token): every shard FATAL at once
//	close 4013 4014                                    fatal          Discord; not Fluxer codes: transient there
//	close 4007 4009 1000 1001                          new session
//	close 4000-4003 4005 4008, unlisted codes          transient      resume
//	close without a code (1005), dropped socket (1006) transient      resume
//	op 7 Reconnect                                     transient      reconnect at once (Deadline now)
//	op 9 d:true (Discord)                              transient      resume
//	op 9 d:false (Discord)                             new session    on a new connection
//	op 9 (Fluxer, always d:false)                      none           Link.Invalidated; identify on the same socket
//	no ACK between two heartbeats (zombie)             transient      close 4000, resume
//	no Hello in HelloTimeout, no READY/RESUMED in      transient
//	  ReadyTimeout (counted from the last dispatch)
//	TCP, TLS or upgrade failure                        transient      a discovered URL is dropped and fetched anew
//	resume URL outside the gateway's domain            new session    never dialled (see Resume hosts)
//	discovery refused the token (401, 403)             fatal          ErrUnauthorized; Failure.Token, as 4004
//	other discovery failure                            transient
//	malformed JSON, garbage, a payload before Hello,   transient      the client closes 4000 and resumes
//	  several "op" keys or one in another case, a
//	  binary frame on an uncompressed connection,
//	  a second Hello, a sequence that goes backwards,
//	  a corrupt zlib/zstd stream, a message over
//	  MaxMessage (10 MiB) compressed or not
//	unknown opcode (Discord)                           transient
//	unknown opcode (Fluxer)                            ignored        its registry: a client "MUST NOT close or
//	                                                                  reconnect solely because the server used
//	                                                                  an opcode newer than this registry"
//	write failure                                      transient
//	panic in a transport goroutine                     transient      via Link.Recover, stack in the events
//
// # Decisions
//
// Goroutines and time. A connection has one reader goroutine, which also
// dials and identifies, while it has something to read (see Parking); one
// clock timer, pointed at the earlier of the next heartbeat, the Hello or
// READY deadline and an identify the gate holds back; and a writer
// goroutine only while operator commands wait for the socket. At most 64
// connections dial at once (maxDialing); the others wait their turn, in
// order, without a goroutine. Close, Send and Identify never block and
// never call the Link: Close records its code and wakes the reader (with a
// read deadline, or from the idler), and the reader sends the close frame
// and waits up to 2 s for the gateway's. Protocol time (heartbeats, Hello
// and READY timeouts, latency, the identify gate, parking) reads the
// injected clock; network deadlines (dial, TLS, upgrade, writes) are real
// time.
//
// Phases. A connection is in one phase at a time (phase.go): dialing,
// hello, identifying or resuming, invalidated (Fluxer's op 9, until the
// core's Identify), live, then failed, closing and ended. phaseMoves lists
// every move in one table; a move it does not list panics, and a move from
// a phase another goroutine has already left is refused. The ending is
// always in that order: report moves to failed and tells the core once,
// Close records the code (the core's own Close, from inside Link.Fail,
// wins), and only the reader moves to ended. Once failed, the reader hands
// nothing more to the sink or the core. A READY while invalidated (no
// identify sent) is a protocol error; a READY on a live socket is passed
// on as before. Parking is not a phase: a connection parks in whichever
// phase it is in (identifying, while the gate holds its identify, or
// live), and the idler's table of sockets is the one record of it.
//
// Parking. On Linux, an uncompressed connection (ws:// or wss://) whose
// reader has read everything (gorilla holds no unread byte) and whose last
// wait for a byte lasted a second or more, or that just finished its READY
// or RESUMED burst, is parked: its reader goroutine ends and the
// transport's one idler goroutine watches its socket with epoll, starting a
// new reader when a byte arrives or Close needs the close frame sent. A
// connection woken again within the second keeps its reader, so busy
// shards never pay for parking. A wait, in place or parked, counts from
// the end of the last message read, before the sink sees it: how long the
// reader then takes (the sink, a busy CPU) says nothing about how often
// the gateway sends, and a test stepping the clock after a delivery finds
// the wait begun before its step. An idle shard (a heartbeat ACK every
// 41 s) thus has no goroutine and no stack. TLS connections park too:
// under crypto/tls a recordConn hands it one record at a time, and above
// it reads take room for a whole record, so crypto/tls never holds a byte
// the socket no longer shows. Compressed connections cannot park (their decompressor
// holds state mid-stream); they keep their reader.
//
// Identify gate. Identifies of one of Discord's buckets go out at least 5 s
// plus IdentifyMargin (50 ms) apart, counted between their writes, not
// between the pacer's grants: a connection that dialled faster than its
// bucket's previous one would otherwise reach the gateway inside the
// window and be refused (see identifyGate).
//
// Heartbeats. The first goes out after interval × Rand(), then one per
// interval. A heartbeat the gateway asks for (op 1) goes out at once and
// restarts the schedule, unless an earlier one is unacknowledged: the
// zombie check must not be put off. Zombie: when a heartbeat is due and the
// oldest unacknowledged one is at least half an interval old. A heartbeat
// carries the last sequence the sink has returned from, which is what
// Fluxer trims its replay buffer to.
//
// Dispatches. Only op, s and t are decoded, by package wire, the reader
// the core also checks /N/send commands with, so that the op the check
// reads is the op the gateway gets; a payload with several "op" keys, or
// one spelt in another case, is a protocol error either way. d reaches the
// sink as the raw bytes of the message, valid during the call. The whole
// message is still checked to be strict JSON, so that the sink never sees
// a broken d, and to be UTF-8: a message that is not (RFC 8259 and, for a
// text frame, RFC 6455 say it must be) has each run of invalid bytes
// replaced by U+FFFD, in a copy, before anything reads it, as encoding/json
// does when it decodes. Repaired, not refused: a replay would bring the
// same bytes back, and one user's broken message must not keep a shard
// reconnecting. A binary frame on an uncompressed connection is refused
// (see the table): JSON comes in text frames, and a client that took any
// bytes as JSON would hide a gateway that compresses without being asked. READY
// reaches the sink with its session_id replaced by "redacted" (the tree
// must never show it); RESUMED and dispatches without a sequence carry
// seq -1. A sequence at or below the last one is dropped and fails the
// connection; a forward gap is accepted (Fluxer's replays have them).
// Fluxer's RESUMED carries the session's current sequence, which becomes
// the one heartbeats report.
//
// No duplicate, no loss. The core replaces a connection without waiting
// for it, so the old reader may still be handing an event to the sink when
// the new connection replays it. A per-shard record of the last sequence
// the sink saw, per session, makes the replay skip exactly those events,
// and stops a connection of an older session from delivering after a
// newer READY. The sink sees each event of a session once, in order.
//
// Resume target. Discord resumes at READY's resume_gateway_url, Fluxer at
// the URL it connected to. Every URL the client dials (discovered,
// configured or resume) keeps only its scheme, host and path; the query is
// the configuration's alone (version, encoding, compression), so that a
// compress= in resume_gateway_url cannot turn on a compression the client
// does not read. A resume URL that cannot be reached falls back, within
// the same attempt, to the gateway URL. One that is malformed or would
// drop TLS is replaced by the URL the session connected to.
//
// Resume hosts. The Resume carries the token, so it goes only where an
// identify would: the host of the configured (--gateway) or last
// discovered gateway URL, a wss:// host under that host's registrable
// domain (for Discord, *.discord.gg), or loopback when the gateway is on
// loopback too (the simulator, a local proxy). The registrable domain is
// the last two labels, three under a two-letter country code whose
// second-level label is short (co.uk): no public-suffix dependency, and
// strict where it errs (see registrableDomain). A resume URL outside
// those, from READY or anywhere else, is never dialled: the attempt fails
// as NewSession, the core backs off and identifies at the discovered URL,
// and the host is logged once per transport (at most 64 hosts), not once
// per attempt.
//
// Compression. zlib-stream is decoded with one deflate context per
// connection, the zlib header checked by hand so that no checksum runs over
// a stream that never ends; a message that does not end in 00 00 ff ff is
// continued by the next, as Discord says to buffer until the suffix.
// zstd-stream is one synchronous decoder per connection. Whether the
// gateway compresses is read from the first frame's type (Fluxer's
// overview says a client must). Fluxer's stream=1 direction is written as a
// zstd frame of raw blocks: valid for the server's decoder, and no encoder
// state (hundreds of KiB) per connection for a few small commands a minute.
//
// Memory. gorilla reads through a 512-byte buffer and borrows its write
// buffer from a shared pool; over TLS idleConn reads ahead for it (a
// record's 16 KiB) into a pooled buffer that goes back once gorilla has
// every byte, and recordConn does the same under crypto/tls. Payload
// buffers come from a pool when a message arrives and go back after the
// sink. So an idle connection holds no buffer of ours. Measured for the
// whole node (node, gateway, core, tree and its logs) against the
// simulator in another process, per idle READY shard, uncompressed and so
// parked, with no goroutine (bench/RESULTS.md): over ws://, 8.0 KB
// resident at 4,096 shards and 6.8 KB at 16,384 (comparison 2); over
// wss://, 19.2 KB and 17.2 KB (comparison 7). crypto/tls's own state per
// connection (AES-GCM keys, record and handshake buffers, the Conn: about
// 6 KB of heap) is most of the difference.
//
// Fencing. A connection whose core.Attempt carries a Fence (a shard under
// a lease) writes through fencedConn: every write gorilla makes on the
// socket, the upgrade request, heartbeats, identify, resume, commands,
// pongs and close frames, first checks the fence (core.Fence.Open: the
// boot clock and the wall clock) and, past it, closes the socket without
// writing (TestFenceDropsWithoutWriting, against the simulator); and no
// received event reaches the Sink past it (TestFenceDropsReads). So a node
// woken from a pause sends no frame and delivers no event for a shard it
// may no longer own, whichever overdue timer or reader runs first. An
// identify also checks its slot's deadline (core.Attempt.IdentifyBy,
// TestIdentifyByDeadline): past it, it is not written, the slot is given
// back and the attempt fails; a lease that expires closes its connections without a close
// frame, which the gateway treats as an abnormal closure (the session
// stays resumable).
//
// Secrets. The token goes into identify, resume and the discovery request
// only; Config hides it from fmt and slog, and no error quotes it. Session
// ids reach the core's Session, which redacts itself, and nothing else.
package gateway
