#!/bin/sh
# last-dispatch-types.sh TREE [N] [SHARD]
# Prints the types of the last N (default 10) dispatch events of the node,
# or of one shard, oldest first.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TREE=${1:?usage: last-dispatch-types.sh TREE [N] [SHARD]}
n=${2:-10}
file=dispatch
[ -n "${3:-}" ] && file="$3/dispatch"
tree_read "$file" | tail -n "$n" | sed -n 's/^{"shard":[0-9]*,"s":[0-9]*,"t":"\([^"]*\)".*/\1/p'
