// Package shardfs builds the file tree that shows a node's shards and takes
// the operator's commands, served by fsrv.
//
// The tree's files, their formats and the ctl commands are stated once,
// for operators, in doc/shardfs.4.md; TestReference in doc/ builds this
// package's tree and fails when the two differ.
//
// Decisions where the design is silent: /dispatch is a journal.Merged view
// of the shards' dispatch logs, so a line is stored once and the same bytes
// are in /dispatch and in /N/dispatch (while /dispatch retains a line, it
// outlives its shard's retention); lease shows the earliest live deadline
// and the largest generation of the local shards; per-shard directories
// are built on first use, so an idle shard nobody looks at costs no tree
// nodes; metrics carry one state series per shard (the current state,
// value 1) rather than six, to keep 16,384 shards to a sane number of
// series.
package shardfs
