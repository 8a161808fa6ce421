#!/bin/sh
# reset-stuck.sh TREE SECONDS
# Resets every shard that has been in BACKOFF for longer than SECONDS, and
# prints the IDs it reset. A reset reconnects at once, resuming when the
# session allows.
# It writes ctl: TREE must be a read-write listener (see lib.sh).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TREE=${1:?usage: reset-stuck.sh TREE SECONDS}
limit=${2:?usage: reset-stuck.sh TREE SECONDS}
tree_read status | while read -r id state _; do
	[ "$state" = BACKOFF ] || continue
	age=$(tree_value "$id/diag" state_age_ms)
	[ -n "$age" ] || continue
	if [ "$age" -gt $((limit * 1000)) ]; then
		tree_write "$id/ctl" reset && echo "$id"
	fi
done
