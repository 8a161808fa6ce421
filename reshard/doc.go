// Package reshard moves a node to a larger plan of the same bot without
// downtime (DESIGN.md section 7.5): the new total and its limits, the
// Mover that runs the new plan beside the old one and switches to it,
// and the Cut that delivers each dispatch once across the switch.
//
// # What stays in core
//
// The core decides nothing about moves. A close 4011 is, for the core, a
// failure that retrying cannot fix like 4004 or 4010 (FATAL, DESIGN.md
// section 2; the gateway classifies close codes), and core.Config.OnFatal
// tells the node which shard went FATAL with which code: Mover.OnFatal is
// that callback, and everything after it (whether to move, to how many
// shards, when to switch) is here. So are the plan arithmetic (ShardOf,
// Split, NextTotal) and the limits (MaxTotal, MovesPerHour, CheckBudget,
// Limiter), which core.Scheduler never consults. This package imports
// core for its types (Plan, Diag, Budget, Flavor) and its error kinds
// (core.ErrUsage, core.ErrBusy), which the tree turns into errnos.
//
// # The move
//
// Decisions where the design is silent:
//   - Only a node that runs its whole plan moves (serve without
//     --shards): a node that runs part of a plan cannot choose its part
//     of the next one. With --etcd (MoverConfig.Fleet) and under supervise (a
//     child refuses even when it runs the whole plan: Mover.Refuse) a
//     move is refused with a line that says so; doc/reshard.md says
//     what each would need.
//   - Automatic moves answer a close 4011 when MoverConfig.Auto is set (serve
//     --total auto); `reshard N` on /ctl moves by hand to N shards,
//     `reshard auto` to what discovery recommends, with the same checks.
//   - Order of the checks: a move already running; the node's own
//     refusals (Refuse, a fleet, part of a plan); the new total when it
//     is given (more shards than now, at most MaxTotal) and the budget it
//     needs (Discord: remaining − reserve must pay for every new shard;
//     Fluxer's budget is a 60 s window that refills, so it only paces);
//     the rate (3 moves an hour), checked, not counted. These are known
//     at once: a `reshard` written to /ctl that fails one of them is
//     refused as the write's error, with its reason (and an
//     event=rejected line). Then, in the background: the new total
//     (discovery, or for Fluxer the community count), the budget again,
//     and the rate, counted last, so that a refused move does not use up
//     one of the 3. A refusal leaves the old plan serving, the 4011 shard
//     FATAL, and says why in /events (event=reshard-refused, or
//     event=rejected for a refused write) and /reshard.
//   - A 4011 of the old plan while a move runs writes its own line
//     (event=reshard-running plan=old): the move under way serves that
//     shard's guilds from the switch.
//   - The new plan shares the node's identify pacer (one budget, buckets
//     by shard id as Discord counts them) and its transport's identify
//     gate, its events log (/events: the new plan's shards write their
//     lines there during the move, after a line event=reshard-start that
//     names the new total; the lines do not say which plan, the
//     reshard-start and reshard-switch lines frame them) and its dispatch
//     log, which the Cut feeds (through each plan's Route) so that each
//     dispatch appears once.
//   - The switch waits SwitchDelay after the last new shard is READY, so
//     that what the gateway sent the old sessions before that READY has
//     arrived (the order per guild at the cut, below; a fixed wait, no
//     heartbeat acknowledgement), then the tree shows the new plan, the
//     held events go out, and the old sessions close with 1000. The Cut
//     keeps matching stragglers for its window, then forgets.
//   - A new shard that goes FATAL during the move (a 4011 of the new
//     plan, a refused token) aborts it, also while it waits for the
//     switch: the move's context ends and the switch checks that the
//     move is still its own, the new sessions end with 1000, the Cut
//     releases what it held but the new sessions' READY (Cut.Abort: the
//     guilds of the old plan's 4011 shard reached only the new plan), and
//     the old plan keeps serving. What the new connections had not read
//     when they close is not delivered: for the guilds of the old 4011
//     shard, as everything the gateway sends them after the abort, until
//     a later move.
//
// The states of /reshard and their moves are one table (stateMoves in
// state.go).
//
// # The cut
//
// While a new plan's shards connect, the gateway sends a guild's events to
// the old plan's session of that guild and, from the moment the new plan's
// session for the guild is READY, to that session too (FACTS.md: Discord
// allows sessions of different num_shards side by side "to orchestrate
// zero-downtime scaling"). A cut by local time alone (the
// old plan's events up to the moment the new shard's READY arrives here,
// then the new plan's) is wrong at the edges: the two connections are not
// in step, so an event the gateway sent to both just after the READY can
// arrive on the old connection first (delivered twice), and one sent to
// the old session just before can arrive after it (lost).
//
// Cut instead matches the copies, whenever they arrive. Each event has a
// fingerprint (its type and a 64-bit hash of its d) and Cut keeps
// multisets of them. An old-plan event is delivered at once, as before
// the move, unless it copies a new-plan event already delivered; a
// new-plan event is dropped when it copies an old-plan event already
// delivered, and otherwise held until the switch (the old plan keeps the
// node's stream until then). When an old-plan event copies a held one,
// the held one is cancelled. At the switch (Switch: every new shard is
// READY and the old ones are being closed with 1000) the held events still
// standing are delivered in the order each new shard received them, and
// from then on the new plan's events pass straight through, each still
// checked against the old plan's stragglers (events the old connections
// had in flight when they closed), which are themselves checked against
// what the new plan delivered. An event sent twice with the same d counts
// twice on both sides, so repeats are neither merged nor lost. Nothing
// depends on the two connections' relative speed: a copy is recognised on
// whichever side it comes second, within Config.Window (30 s) of the
// first.
//
// Abort ends a move that will not switch (a new shard went FATAL): the
// held events still standing are delivered as at a switch, so that what
// only the new plan received (the guilds of an old shard that closed 4011,
// which no old session serves any more) is not lost, and the matching goes
// on until Forget, so that an old twin arriving later is not delivered
// again. Only the ending sessions' READY events are not delivered (they
// name sessions that are gone), counted in Stats.Discarded.
//
// What it costs and what it assumes:
//   - The same bytes: a copy is recognised only when both plans' sessions
//     received the same type and byte for byte the same d. That is an
//     assumption, not a documented fact: FACTS.md says Discord runs
//     sessions of different num_shards side by side, not how it encodes
//     one event for two sessions, and nothing about Fluxer running two
//     totals; the simulator sends the same bytes. If a gateway's bytes
//     differed (key order, a field per session), no copy would be
//     recognised: each event sent to both plans during the overlap would
//     appear twice in the dispatch log (a double, never a loss), and
//     Stats.Dropped (the node's /reshard copies_dropped) would stay 0
//     while the overlap lasts, which is how to see it.
//   - Memory: a fingerprint (about 50 bytes with the map's overhead) per
//     old-plan event of the move whose copy has not come (the events of
//     guilds whose new shard is not READY yet, and those sent only to the
//     old plan), until Forget; and the held new-plan events whole, which
//     are only those not yet matched: the new sessions' own READY and
//     GUILD_CREATEs, and copies whose old twin is still on its way. The
//     held bytes are bounded (Config.MaxHeld); past the bound the oldest
//     are delivered early and counted in Stats.Overflow (each one may come
//     twice if its old twin arrives later: counted, never silently).
//   - The events only the new plan received (its READY and the
//     GUILD_CREATEs that follow) are delivered at the switch, after the old
//     plan's events of the overlap: the order per guild of the events both
//     plans received is kept, and a guild's new GUILD_CREATE comes after
//     them. An old-plan straggler that has no copy is delivered after the
//     switch.
//   - Forget ends the bookkeeping once the old connections are closed and
//     the new plan has had time to deliver its copies of what they
//     received (the Mover calls it DefaultWindow, 30 s, after the switch or
//     the abort); a copy arriving later would be delivered twice.
//   - Two events of the same type and d, one sent only to the old plan and
//     one only to the new, that arrive within the window of each other are
//     taken for twins and one of them is not delivered. Discord's and
//     Fluxer's events carry ids, timestamps or sequence-like fields that
//     make such pairs rare (a member toggling the same presence twice
//     within 30 s across the moment its guild's new shard became READY).
//   - Order per guild needs the old connections to have delivered, by the
//     switch, what the gateway sent them before the last new READY: an
//     old-only straggler is delivered after the switch, after newer
//     events. The Mover does not prove it: it switches a fixed time
//     (SwitchDelay, 1 s) after the last new READY, far longer than
//     two connections to one gateway drift apart, and awaits no heartbeat
//     acknowledgement. Exactly-once does not depend on it.
//   - A 64-bit hash collision between two different events of the move
//     would drop one of them; with a random seed per move the chance for a
//     million events is below one in ten million.
package reshard
