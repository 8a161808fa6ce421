// Package supervisor runs children that each serve a block of a plan's
// shards, restarts them under a bounded policy, and serves one tree for
// all of them (DESIGN.md section 7.4).
//
// # Children and their channel
//
// A child is the same binary running serve for its block (Exec). It
// gets the token in a pipe (descriptor 3, as serve's own re-execution
// hands it over) and a private channel of two socketpairs (descriptors
// 4 and 5, close on exec in the child): neither the token nor the session
// IDs ever travel in arguments or the environment, and the channel cannot
// be reached by anyone else. The control stream (descriptor 4) carries
// one line per message (channel.go): readiness, the count of READY
// shards, each shard's state, sequence, reconnects and latency (pushed at
// each of the child's events and at least every second: the watchdog's
// sign of life), identify requests, grants (with their floors) and
// writes, shutdown, each new session and the session start limit its
// discoveries learnt; the data stream (descriptor 5) the copies of the
// child's dispatch and events lines, so that identify requests, state and
// shutdown never queue behind dispatch. Every control message about a
// shard is checked against the child's block, and a limit for figures
// that cannot be; what is refused is logged and dropped. When a child
// exits, the parent reads both streams to the end (bounded: 5 s) before
// it reports the exit, so that the lines a clean stop flushes after
// saving its sessions all reach /dispatch. Reaping does not wait for the
// child's stdout and stderr (the parent's own pipes, not exec's): a
// grandchild that holds them does not keep the child a zombie. Each
// child's unix socket is named by its block's index in a private
// temporary folder, so that the path fits sun_path whatever the ID (up to
// 128 characters). Children run in their own process group, so a
// terminal's Ctrl-C reaches the parent alone, which stops them in order;
// a child ignores SIGPIPE, and when its channel ends (the parent died) it
// shuts down cleanly, saving its sessions. A child that writes garbage on
// its channel or closes it while it runs is named in the log and
// stopped, and the restart policy treats that as a failure; the others
// are not touched. Children's stdout and stderr reach the parent's stderr
// line by line, labelled "[child ID]", through one bounded queue per
// child (256 lines), which the writer takes in turn: a child that floods
// loses its own lines (counted, and said once its queue drains), never
// another child's, and never blocks itself, the parent or the others.
//
// # Restart policy
//
// The Fluxerly SDK's, on the injected clock: a child that exits
// unexpectedly (or misses the startup timeout, or breaks its channel, or
// is killed by the watchdog) is restarted after MinDelay doubling to
// MaxDelay, at most MaxAttempts times in a row; the next such exit
// leaves that child failed, alone (with MaxAttempts 0 the first exit
// does). With FailAll, the SDK's rule instead: it fails the supervisor,
// which logs why and stops every child; without, the supervisor fails
// only once every child is failed. A child whose shards have all been
// READY for HealthyReset gets its attempts back. The watchdog: a running
// child silent on its control stream for Watchdog is hung, killed
// (SIGKILL) and handed to the policy. Stopping is SIGTERM (and shutdown
// on the channel), SIGKILL after ShutdownTimeout. A stop that needed
// SIGKILL is not clean, nor is an exit non-zero or by a signal while
// stopping: the child may have saved some sessions past the last line
// the parent got, so its next start is told Crashed (supervise drops its
// snapshots and, on Discord, writes the parent's resume points instead).
// Every action is logged before it is taken. "running" means the child
// serves its tree, not that its shards are READY: with a large block at
// max_concurrency 1 that takes minutes, far beyond any startup timeout.
//
// restart ID stops the child (it saves its sessions) and starts it again
// at once, counting no attempt. restart all does that one child at a time,
// the next only once every shard of the previous one is READY again; if
// they are not within the startup timeout the rollout stops there, logged
// with the children not restarted, so that a bad deploy breaks one child,
// not all. FATAL is not READY: a shard left FATAL holds every rollout at
// its child until the operator retries it (or restarts the children one
// by one), the price of never carrying a bad build further.
//
// # Identify pacing
//
// The parent runs the core's pacer (buckets, budget and reserve) for
// every child: a child's core asks over the channel and identifies when
// the grant comes back, so N children start as fast as one node and
// never overspend. Discord counts its 5 s between two identifies of a
// bucket between their arrivals, and an identify leaves only once its
// connection is dialled, upgraded and greeted, which takes a different
// time for every connection: spacing the grants does not space the
// writes, and each child's gateway client spaces only its own. So each
// child reports the moment it wrote an identify (a written message),
// and SpacedPacer gives each grant a floor, the bucket's last reported
// write plus 5 s and the gateway's 50 ms margin
// (gateway.DefaultIdentifyMargin, one node's spacing); the child's
// gateway client holds the identify until then
// (gateway.Config.IdentifyNotBefore) besides its own spacing. Writes
// and floors are wall-clock moments: the children run on the parent's
// host and share its clock. Grants come at the core's rhythm, but a
// bucket's next grant waits until the previous grant's write is
// reported (the report is normally back long before the core's next
// grant), at most WriteReportWait (15 s): a connection that failed
// before its identify reports nothing. Past the bound the grant carries
// the floor of the last write reported, so an identify written more
// than 15 s after its grant may come too close to another child's and
// get op 9 (its shard starts again with a new slot). Measured against
// the simulator: 64 shards in 4 children at max_concurrency 4 start
// with rounds 5.05 s apart, as one node's. A request of a child that
// exits is cancelled. What a child's discovery learns of the session
// start limit goes to the parent's pacer too (a limit message before
// the identify request it precedes), which lowers what remains, never
// raises it: a parent whose own discovery failed still enforces the
// budget once a child has discovered.
//
// # One tree
//
// Tree serves /N for every owned shard: state, sequence, reconnects and
// /status come from what the owning child pushed, asking no child; diag,
// ctl and send are forwarded over 9P to the owning child's private unix
// socket (dial, handshake and call bounded together, 2 s, with no lock
// held across them, so a hung child delays its own files only); while
// the child is not running, state reads ASSIGNED and sequence the last
// one the parent saw. /dispatch, /events
// and each /N/dispatch and /N/events are the parent's own logs, built from
// the lines the children copy, so they outlive the children's restarts
// and their offsets go on: the parent alone keeps the history, a child
// keeps its lines in transit only (TransitDispatch, TransitEvents). A
// line the transit buffer dropped before it was copied is counted for
// its shard, and a gap line per shard (Link.CopyDispatch) stops that
// shard alone from resuming from the parent's points after a crash.
// /status joins the children's; /identify is the
// shared pacer's; /children has one line per child (id state pid
// restarts generation shards last_exit silent, pid and silent "none"
// without a process; silent is the age of the child's last push); /ctl
// takes restart ID|all and the node commands, each sent to the children
// that own its shards. /metrics merges the children's families, each
// sample labelled child=ID, with the parent's children by state, and
// restarts, hangs, gaps and silence by child. Not combined yet: /lease.
//
// One supervise holds its --sessions folder (supervise.lock, flock): a
// second one is refused before it starts anything, and a child's folder
// still held by a killed predecessor's child is waited for, bounded.
//
// # Resuming a crashed child (beyond the SDK)
//
// Each new session a child's shard starts is reported on the channel; the
// parent takes it as resumable once the READY line of that session is in
// its /dispatch, and counts the sequence of every later dispatch line it
// appends. When a child's process ended without a clean stop and was
// reaped (waitpid: nobody holds its sessions any more), the parent writes
// each such session with the last sequence its /dispatch holds into the
// child's sessions folder before the next start, which resumes it: the
// gateway replays what the parent had not seen, so /dispatch has every
// event once, whatever the dead child had received but not copied.
// Cases where this is not safe keep the SDK's rule (a crash starts new
// sessions):
//   - Fluxer: its heartbeats trim the replay buffer to the sequence the
//     child acknowledged, which may be past the parent's, and a resume
//     below it closes 4007; only Discord crashes resume.
//   - A session whose READY line the parent had not received when the
//     child died: the parent does not know where it starts.
//   - A parent that dies: its children shut down cleanly and save their
//     own sessions, as serve does on SIGTERM.
//
// A sequence older than the gateway's replay buffer gets op 9 and a new
// session: no event is doubled, some may be missed, and the epoch says so.
package supervisor
