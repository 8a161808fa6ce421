#!/bin/sh
# watch-states.sh TREE [INTERVAL] [ROUNDS]
# Prints every shard's state when it changes: "time shard old -> new".
# Polls every INTERVAL seconds (default 1), forever or for ROUNDS polls.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TREE=${1:?usage: watch-states.sh TREE [INTERVAL] [ROUNDS]}
interval=${2:-1}
rounds=${3:-0}
prev=$(mktemp)
cur=$(mktemp)
trap 'rm -f "$prev" "$cur"' EXIT
n=0
while :; do
	tree_read status | awk '{ print $1, $2 }' >"$cur" || die "cannot read $TREE/status"
	awk -v t="$(date -u +%H:%M:%S)" '
		FILENAME == ARGV[1] { old[$1] = $2; next }
		old[$1] != $2 { printf "%s shard %s %s -> %s\n", t, $1, (old[$1] == "" ? "none" : old[$1]), $2 }
	' "$prev" "$cur"
	cp "$cur" "$prev"
	n=$((n + 1))
	[ "$rounds" -gt 0 ] && [ "$n" -ge "$rounds" ] && exit 0
	sleep "$interval"
done
