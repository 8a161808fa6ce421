// Package shardfs builds the file tree that shows a node's shards and takes
// the operator's commands, served by fsrv.
//
// The tree (DESIGN.md section 4):
//
//	/ctl          rw  node commands: reset|stop|start|identify|retry all|ID..., lease DURATION, lease off
//	/events       r   lifecycle log of every local shard (logfmt, time first)
//	/status       r   one line per local shard: id state sequence reconnects latency_ms
//	/plan         r   key value lines: flavor, total, shards, gateway, max_concurrency, ...
//	/lease        r   key value lines: backend, armed, expired, generation, deadline, remaining
//	/metrics      r   Prometheus text exposition
//	/dispatch     r   dispatch events of every local shard, one JSON object a line, with "shard"
//	/N/state      r   one word: ASSIGNED STARTING READY BACKOFF FATAL STOPPED
//	/N/sequence   r   last dispatch sequence in decimal, or none
//	/N/reconnects r   decimal count
//	/N/ctl        rw  shard commands: reset, stop, start, identify, retry, lease DURATION, lease off
//	/N/events     r   this shard's lifecycle log
//	/N/diag       r   key value lines: every diagnostic of the core and the transport
//	/N/dispatch   r   this shard's dispatch events, one JSON object a line
//	/N/send       w   gateway commands, one JSON object a line, paced by the send budget
//
// Decisions where DESIGN.md is silent: a dispatch line is
// {"shard":N,"s":SEQ,"t":"TYPE","d":...}, the same line in /dispatch and in
// /N/dispatch, so one format serves both, and the same bytes: /dispatch is
// a journal.Merged view of the shards' logs, so a line is stored once
// (while /dispatch retains a line, it outlives its shard's retention);
// status has no header line, so
// that scripts can read it with `while read`; lease shows the earliest live
// deadline and the largest generation of the local shards; per-shard
// directories are built on first use, so an idle shard nobody looks at
// costs no tree nodes; metrics carry one state series per shard (the current
// state, value 1) rather than six, to keep 16,384 shards to a sane number of
// series.
package shardfs
