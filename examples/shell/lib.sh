# shellcheck shell=sh
# lib.sh: the three verbs every example needs, on a mounted tree or, where
# mounting is impossible, through the built-in client.
#
# TREE is either the directory where the tree is mounted
# (mount -t 9p -o trans=unix,version=9p2000.L,access=UID SOCKET /mnt/shardfs)
# or 9p!ADDR, for example 9p!unix!/run/shardfs.sock, to go through
# `shardfs cat` and `shardfs write` instead. serve's TCP listener
# (tcp!127.0.0.1!5640) is read-only: the scripts that only read work there,
# those that write (keep-lease.sh, reset-stuck.sh) need the unix socket or
# another read-write listener. POSIX sh: it runs under busybox too.

tree_read() {
	case $TREE in
	9p!*) shardfs cat --addr "${TREE#9p!}" "$1" ;;
	*) cat "$TREE/$1" ;;
	esac
}

tree_write() {
	case $TREE in
	9p!*) shardfs write --addr "${TREE#9p!}" "$1" "$2" ;;
	*) printf '%s\n' "$2" >"$TREE/$1" ;;
	esac
}

# tree_value FILE KEY prints the value of KEY in a file of "key value"
# lines (plan, lease, N/diag).
tree_value() {
	tree_read "$1" | awk -v k="$2" '$1 == k { sub(/^[^ ]+ /, ""); print; exit }'
}

die() {
	echo "$0: $*" >&2
	exit 2
}
