#!/bin/sh
# wait-ready.sh TREE [TIMEOUT]
# Waits until every shard is READY; exits 0 then, or 1 after TIMEOUT
# seconds (default 600) with the shards that are not READY on stderr.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TREE=${1:?usage: wait-ready.sh TREE [TIMEOUT]}
timeout=${2:-600}
start=$(date +%s)
while :; do
	status=$(tree_read status) || die "cannot read $TREE/status"
	waiting=$(printf '%s\n' "$status" | awk '$2 != "READY" { print $1 "=" $2 }')
	[ -z "$waiting" ] && exit 0
	if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
		echo "not READY after ${timeout}s: $(printf '%s\n' "$waiting" | tr '\n' ' ')" >&2
		exit 1
	fi
	sleep 1
done
