// Package relay serves the gateway relay of DESIGN.md section 9: bot
// processes connect to shardfs as if it were Discord's gateway, and get
// each shard's dispatches from the shard's dispatch journal.
//
// # How it works
//
// The node keeps one real session per shard; the relay never opens one.
// Every client connection reads the shard's dispatch journal (package
// journal) from its own offset, so a client's sequence numbers are its
// own, a slow client only lags (until it falls below the journal's
// retention, when it is closed 4009), and a RESUME is a replay from the
// offset after the client's last sequence: exactly once, because the
// offset names one line. One follower per shard reads the same journal to
// keep the cache that READY and the GUILD_CREATEs are made from; a client
// starts reading at the offset the cache reflects, so the snapshot and the
// live stream meet without a gap or a double.
//
// Ops 3, 4 and 8 go to Config.Send (the shard's paced send path, like
// N/send). A GUILD_MEMBERS_CHUNK goes only to the client whose op 8 asked
// for it (the relay rewrites the nonce and restores it); the bot's own
// VOICE_STATE_UPDATE and the VOICE_SERVER_UPDATE of a guild go only to the
// client that sent the last op 4 for that guild. The relay's nonces are
// "relay" and a base-36 counter from 1, per relay; a chunk with another
// nonce (an operator's N/send) goes to no client.
//
// # Decisions where DESIGN.md is silent
//
// The replay depth is the shard's dispatch journal (serve's dispatch
// retention, 256 KiB per shard by default): a RESUME whose sequence is no
// longer retained gets op 9 false and then a fresh READY, as Discord does
// when its own buffer is gone. A client that floods commands (more than
// 120 in 60 s, heartbeats included) is closed 4008 like the real gateway
// does; a forwarded command that the shard's send queue refuses closes
// it 4008 too, so nothing waits without bound.
//
// A client whose identify lacks MESSAGE_CONTENT gets MESSAGE_CREATE and
// MESSAGE_UPDATE with content, embeds, attachments and components empty
// and no poll, as Discord sends them to such an app, except in a DM, in
// the bot's own messages and in those that mention the bot. Nested
// messages (referenced_message, message_snapshots) are passed as they
// are.
//
// # Fluxer
//
// In front of a Fluxer node (Config.Flavor) the relay speaks Fluxer v1
// (DESIGN.md section 3): v=1 only, else 4012 before Hello; no intents (an
// identify's are ignored and every dispatch is delivered); READY without
// resume_gateway_url (a client resumes where it connected); op 9 is
// always false and leaves the socket open for an identify, as on Discord
// here; a heartbeat whose sequence was never sent closes 4007; the send
// budget is 500 messages a minute; compress=zstd-stream compresses what
// the relay sends and with stream=1 what the client sends too (any zstd
// the client writes, one payload or several a message). Like Fluxer, the
// relay asks for a heartbeat with op 1 at 90% of the interval after the
// last one (or Hello), and closes 4009 after 45 s without a message. Ops 14, 15 and 16 pass to the
// shard's send path like op 3 and their replies reach every client of the
// shard. Discovery answers under /v1 as well as /api/v10, with the plan's
// total (Fluxer's own says 1: a client must identify with the node's) and
// Fluxer's constant limits. REST is not passed through on Fluxer.
// zstd-stream is offered on Discord too.
package relay
