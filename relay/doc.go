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
// it 4008 too, so nothing waits without bound. MESSAGE_CONTENT is not
// blanked for a client that lacks the intent (the node's own intents
// decide what content arrives).
package relay
