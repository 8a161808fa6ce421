#!/bin/sh
# /init of the v9fs integration guest (v9fs_test.go builds the image).
# Busybox ash: read -t is the one feature beyond POSIX sh it relies on.
#
# The test process serves a shardfs node on virtio-serial ports, one per
# mount, and steers the guest through the port named ctl. Everything the
# test reads is on the console, in lines that start "@@shardfs ". At each
# stop the guest prints a line and waits for the test's answer on ctl: at
# "next" the answer is "run SCENARIO" or "poweroff"; at "at WHAT" it is "go"
# or "go TEXT".
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp

say() { echo "@@shardfs $*"; }

die() {
	say "FAIL $*"
	ps -o pid,stat,args | while IFS= read -r l; do say "ps| $l"; done
	dmesg | tail -n 30 | while IFS= read -r l; do say "dmesg| $l"; done
	poweroff -f
	exit 1
}

# now_ms prints the guest's uptime in milliseconds.
now_ms() {
	read -r up _ </proc/uptime
	frac=${up#*.}
	frac=${frac#0}
	echo $((${up%.*} * 1000 + frac * 10))
}

# waitfor SECONDS CMD... runs CMD every 0.2 s until it succeeds, for at
# most SECONDS.
waitfor() {
	limit=$(($(now_ms) + $1 * 1000))
	shift
	until "$@"; do
		[ "$(now_ms)" -lt "$limit" ] || return 1
		sleep 0.2
	done
}

# await WHAT prints a stop and sets reply to the test's answer.
await() {
	say "$*"
	# shellcheck disable=SC3045 # busybox read has -t
	read -r -t 300 reply <&8 || die "no answer from the test at: $*"
}

# pass WHAT stops at "at WHAT" and sets text to what follows "go".
pass() {
	await "at $1"
	case $reply in
	go) text= ;;
	go\ *) text=${reply#go } ;;
	*) die "at $1 the test said: $reply" ;;
	esac
}

# show NAME CMD... runs CMD and prints each line of its output as
# "NAME| line", then "NAME rc=STATUS".
show() {
	name=$1
	shift
	"$@" </dev/null >/tmp/show.out 2>&1
	rc=$?
	while IFS= read -r l || [ -n "$l" ]; do say "$name| $l"; done </tmp/show.out
	say "$name rc=$rc"
}

# put FILE TEXT writes a line as an operator's shell does: echo TEXT >FILE.
put() { echo "$2" >"$1"; }

# portdev NAME prints the device of the virtio-serial port called NAME.
portdev() {
	for n in /sys/class/virtio-ports/*/name; do
		if [ -r "$n" ] && [ "$(cat "$n")" = "$1" ]; then
			d=${n%/name}
			[ -c "/dev/${d##*/}" ] || return 1
			echo "/dev/${d##*/}"
			return 0
		fi
	done
	return 1
}

# mount9p PORT DIR OPTIONS mounts the tree served on port PORT at DIR. The
# kernel cannot use the port itself as a trans=fd channel (virtio_console
# has no read_iter/write_iter), so two cats relay it to two FIFOs.
mount9p() {
	waitfor 10 portdev "$1" >/dev/null || die "no virtio port $1"
	dev=$(portdev "$1")
	fifo=/run/9p/$1
	mkdir -p "$fifo" "$2"
	mkfifo "$fifo/in" "$fifo/out"
	exec 9<>"$dev"
	cat <&9 >"$fifo/in" &
	cat "$fifo/out" >&9 &
	exec 9>&-
	# A mount whose server never answers waits in the kernel until killed.
	timeout -s KILL 30 mount -t 9p -o "trans=fd,rfdno=3,wfdno=4,$3" shardfs "$2" 3<>"$fifo/in" 4<>"$fifo/out"
}

state_is() { [ "$(cat "$1/state")" = "$2" ]; }

all_ready() {
	awk 'NF { n++ } $2 != "READY" { bad = 1 } END { exit bad || n == 0 }' "$1/status"
}

TREE=/mnt/dotl
export TREE

s_mount() {
	mount9p dotl "$TREE" version=9p2000.L || die "mount version=9p2000.L failed"
	waitfor 60 all_ready "$TREE" || die "shards not READY: $(cat "$TREE/status")"
	show ls-root ls -l "$TREE"
	show ls-shard ls -l "$TREE/0"
	show state cat "$TREE/0/state"
	show sequence cat "$TREE/0/sequence"
	show reconnects cat "$TREE/0/reconnects"
	show diag cat "$TREE/0/diag"
}

s_reset() {
	show reset put "$TREE/0/ctl" reset
	show reconnects cat "$TREE/0/reconnects"
}

s_lease() {
	t0=$(now_ms)
	show arm put "$TREE/0/ctl" "lease 2s"
	waitfor 20 state_is "$TREE/0" STOPPED || die "0/state is $(cat "$TREE/0/state"), not STOPPED, 20 s after lease 2s"
	say "stopped after_ms=$(($(now_ms) - t0))"
	show stopped cat "$TREE/0/state"
	pass lease-expired
	show off put "$TREE/0/ctl" "lease off"
	waitfor 20 state_is "$TREE/0" READY || die "0/state is $(cat "$TREE/0/state"), not READY, 20 s after lease off"
	show ready cat "$TREE/0/state"
}

s_reject() {
	show frob put "$TREE/0/ctl" frobnicate
	show events grep -F "event=rejected cmd=? len=10 " "$TREE/0/events"
	# A write without a newline is a command whose error the writer sees;
	# a write that fails part-way applies the lines before the bad one
	# once (issue 21 items 9 and 10).
	show bogus sh -c "printf bogus >$TREE/0/ctl"
	show partial sh -c "printf 'reset\nbogus\n' >$TREE/0/ctl"
}

s_tail() {
	tail -f "$TREE/0/events" >/tmp/tail.out 2>&1 &
	tail=$!
	waitfor 10 test -s /tmp/tail.out || die "tail -f printed nothing"
	# One failure at a time, each on a READY shard, while tail follows.
	for i in 1 2 3; do
		waitfor 20 state_is "$TREE/0" READY || die "0/state is $(cat "$TREE/0/state"), not READY"
		pass "inject-$i"
		waitfor 20 grep -q "$text" /tmp/tail.out || die "tail -f did not show: $text"
	done
	kill "$tail"
	wait "$tail"
	show tail cat /tmp/tail.out
	show statfs stat -f -c %t "$TREE"
}

# dialect PORT DIR VERSION mounts with another protocol version and does
# the reads and the reset of s_mount and s_reset there.
dialect() {
	mount9p "$1" "$2" "version=$3" || die "mount version=$3 failed"
	show ls-root ls -l "$2"
	show ls-shard ls -l "$2/0"
	show state cat "$2/0/state"
	show sequence cat "$2/0/sequence"
	show reconnects cat "$2/0/reconnects"
	show diag cat "$2/0/diag"
	show reset put "$2/0/ctl" reset
	show reconnects-after cat "$2/0/reconnects"
	show frob put "$2/0/ctl" frobnicate
}

s_legacy() { dialect legacy /mnt/legacy 9p2000; }

s_dotu() { dialect dotu /mnt/dotu 9p2000.u; }

s_aname() {
	mount9p aname /mnt/shard3 version=9p2000.L,aname=/3 || die "mount aname=/3 failed"
	show ls ls -l /mnt/shard3
	show state cat /mnt/shard3/state
	show reconnects cat /mnt/shard3/reconnects
	mount9p aname9p /mnt/shard3-9p version=9p2000,aname=/3 || die "mount version=9p2000,aname=/3 failed"
	show ls-9p ls -l /mnt/shard3-9p
	show state-9p cat /mnt/shard3-9p/state
}

# s_readonly mounts a port served as a ,ro listener (serve's default TCP):
# reads work, writes are refused, dispatch and send are not there.
s_readonly() {
	# access=UID, as the README mounts: only that user may use the mount.
	mount9p readonly /mnt/ro version=9p2000.L,access=0 || die "mount of the read-only port failed"
	show ls-root ls -l /mnt/ro
	show ls-shard ls -l /mnt/ro/0
	show state cat /mnt/ro/0/state
	show reset put /mnt/ro/0/ctl reset
	show dispatch cat /mnt/ro/0/dispatch
	show reconnects cat /mnt/ro/0/reconnects
}

# /etc/examples has a line per script: its name, a tab, a command line.
s_examples() {
	while IFS='	' read -r name cmd; do
		show "$name" timeout 120 sh -c "$cmd"
	done </etc/examples
}

# The TLS scenarios (tls_test.go): the guest has a virtio NIC on QEMU's
# user network, where 10.0.2.100:5641 is forwarded to the host's tls!
# listener, and /bin/shardfs with the certificates in /etc/shardfs.
TLSADDR='tls!10.0.2.100!5641'

tlsargs() { echo "--cert /etc/shardfs/$1.crt --key /etc/shardfs/$1.key --ca /etc/shardfs/ca.crt"; }

mounted() { grep -q " $1 9p " /proc/mounts; }

s_tlsmount() {
	waitfor 10 test -e /sys/class/net/eth0 || die "no eth0"
	ip link set lo up
	ip addr add 10.0.2.15/24 dev eth0 || die "ip addr"
	ip link set eth0 up || die "ip link"
	mkdir -p /mnt/tls
	# shellcheck disable=SC2046 # tlsargs is words
	show refused timeout 30 shardfs mount "$TLSADDR" /mnt/tls $(tlsargs expired)
	t0=$(now_ms)
	# shellcheck disable=SC2046
	shardfs mount "$TLSADDR" /mnt/tls $(tlsargs client) >/tmp/mount.out 2>&1 &
	mountpid=$!
	waitfor 30 mounted /mnt/tls || die "shardfs mount: $(cat /tmp/mount.out)"
	say "mounted after_ms=$(($(now_ms) - t0))"
	TREE=/mnt/tls
	waitfor 60 all_ready "$TREE" || die "shards not READY: $(cat "$TREE/status")"
	show ls-root ls -l "$TREE"
	show state cat "$TREE/0/state"
	show mounts grep " /mnt/tls " /proc/mounts
}

s_tlsreset() {
	show reset put "$TREE/0/ctl" reset
	show reconnects-after cat "$TREE/0/reconnects"
	show frob put "$TREE/0/ctl" frobnicate
	show events grep -F "event=rejected cmd=? len=10 " "$TREE/0/events"
}

# s_tlsro mounts shard 3 read-only and ends shardfs mount with a signal,
# which unmounts.
s_tlsro() {
	mkdir -p /mnt/tls3
	# shellcheck disable=SC2046
	shardfs mount "$TLSADDR" /mnt/tls3 --ro --aname /3 $(tlsargs client) >/tmp/mount3.out 2>&1 &
	pid3=$!
	waitfor 30 mounted /mnt/tls3 || die "shardfs mount --ro: $(cat /tmp/mount3.out)"
	show ro-state cat /mnt/tls3/state
	show ro-reset put /mnt/tls3/ctl reset
	# A file held open makes the unmount busy: the mount is detached and
	# the relay serves the open file until it is closed.
	exec 7</mnt/tls3/events
	kill -TERM "$pid3"
	waitfor 10 sh -c '! grep -q " /mnt/tls3 9p " /proc/mounts' || die "/mnt/tls3 not detached after SIGTERM"
	if kill -0 "$pid3" 2>/dev/null; then say "relay alive while a file is open"; fi
	show held sh -c 'head -n 1 <&7'
	exec 7<&-
	wait "$pid3"
	say "mount3-exit rc=$?"
	if mounted /mnt/tls3; then say "still mounted"; fi
	show mount3-out cat /tmp/mount3.out
}

# s_plain mounts through shardfs mount without TLS: 10.0.2.100:5640 is
# forwarded to a plain TCP listener of the test.
s_plain() {
	mkdir -p /mnt/plain
	shardfs mount 'tcp!10.0.2.100!5640' /mnt/plain >/tmp/plain.out 2>&1 &
	pidp=$!
	waitfor 30 mounted /mnt/plain || die "shardfs mount tcp!: $(cat /tmp/plain.out)"
	show plain-state cat /mnt/plain/0/state
	show plain-umount umount /mnt/plain
	wait "$pidp"
	say "plain-exit rc=$?"
}

s_tlsumount() {
	show umount umount /mnt/tls
	wait "$mountpid"
	say "mount-exit rc=$?"
	show mount-out cat /tmp/mount.out
}

# The freeze scenario (freeze_test.go): a serve in the guest against the
# host's simulator at 10.0.2.100:5650 (TLS, the test's CA), its tree on 10.0.2.15:5640, which
# the host reaches through a hostfwd. The test drives it from there.
s_freeze() {
	waitfor 10 test -e /sys/class/net/eth0 || die "no eth0"
	ip link set lo up
	ip addr add 10.0.2.15/24 dev eth0 || die "ip addr"
	ip link set eth0 up || die "ip link"
	SSL_CERT_FILE=/etc/shardfs/ca.crt SHARDFS_TOKEN=$(cat /etc/shardfs/token) shardfs serve --flavor discord \
		--gateway wss://10.0.2.100:5650/ --total 1 --max-concurrency 1 \
		--backoff fixed:100ms --listen 'tcp!0.0.0.0!5640,insecure' >/tmp/serve.out 2>&1 &
	servepid=$!
	say "serving pid=$servepid"
	waitfor 120 grep -qs ':1608 ' /proc/net/tcp /proc/net/tcp6 || { show serve-out cat /tmp/serve.out; die "serve not listening on 5640"; }
	pass frozen
	show serve-out tail -n 40 /tmp/serve.out
}

# s_fleetfreeze runs serve in a fleet (etcd on the host, through a
# guestfwd at 10.0.2.100:5651) once per "go FLAGS" at "at serve" (serve's
# extra flags: the node's name, --confirm-delivery=false), until "go stop";
# each serve is killed at the end of its round.
s_fleetfreeze() {
	waitfor 10 test -e /sys/class/net/eth0 || die "no eth0"
	ip link set lo up
	ip addr add 10.0.2.15/24 dev eth0 || die "ip addr"
	ip link set eth0 up || die "ip link"
	while pass serve && [ "$text" != stop ]; do
		# shellcheck disable=SC2086 # $text is serve's extra flags, split on purpose
		SSL_CERT_FILE=/etc/shardfs/ca.crt SHARDFS_TOKEN=$(cat /etc/shardfs/token) shardfs serve --flavor discord \
			--gateway wss://10.0.2.100:5650/ --total 1 --max-concurrency 1 \
			--backoff fixed:100ms --listen 'tcp!0.0.0.0!5640,insecure' \
			--etcd http://10.0.2.100:5651 --etcd-insecure --bot b --etcd-ttl 5s $text >/tmp/serve.out 2>&1 &
		servepid=$!
		say "serving pid=$servepid"
		waitfor 120 grep -qs ':1608 ' /proc/net/tcp /proc/net/tcp6 || { show serve-out cat /tmp/serve.out; die "serve not listening on 5640"; }
		pass frozen
		show serve-out tail -n 40 /tmp/serve.out
		kill -9 "$servepid"
		wait "$servepid"
	done
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /run /root
while read -r m; do
	insmod "/lib/modules/$m.ko" || die "insmod $m"
done </etc/modules
waitfor 10 portdev ctl >/dev/null || die "no virtio port ctl"
exec 8<>"$(portdev ctl)"

while await next; do
	case $reply in
	run\ *)
		s=${reply#run }
		say "begin $s"
		"s_$s"
		say "end $s"
		;;
	poweroff) break ;;
	*) die "unknown command from the test: $reply" ;;
	esac
done
for m in /mnt/*; do
	umount "$m" 2>/dev/null
done
poweroff -f
