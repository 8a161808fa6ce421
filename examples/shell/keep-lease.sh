#!/bin/sh
# keep-lease.sh TREE LEASE INTERVAL CHECK...
# Renews the node's lease (for example 30s) every INTERVAL seconds while the
# health check CHECK (a command and its arguments) succeeds. When the check
# fails, it stops renewing: the lease runs out and the shards stop, so a
# sick node cannot keep shards that another node could run. Set ROUNDS to
# stop after that many checks (0, the default, runs forever).
# It writes ctl: TREE must be a read-write listener (see lib.sh).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TREE=${1:?usage: keep-lease.sh TREE LEASE INTERVAL CHECK...}
lease=${2:?usage: keep-lease.sh TREE LEASE INTERVAL CHECK...}
interval=${3:?usage: keep-lease.sh TREE LEASE INTERVAL CHECK...}
shift 3
[ $# -gt 0 ] || die "no health check given"
n=0
while :; do
	if "$@"; then
		tree_write ctl "lease $lease" || die "cannot renew the lease"
	else
		echo "health check failed; not renewing the lease" >&2
	fi
	n=$((n + 1))
	[ "${ROUNDS:-0}" -gt 0 ] && [ "$n" -ge "${ROUNDS:-0}" ] && exit 0
	sleep "$interval"
done
