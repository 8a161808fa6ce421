// Package baremetal is PID 1 of a PXE-booted shardfs node, and builds the
// netboot image that boots it.
//
// Boot mounts the pseudo file systems (RootFS, a table that prints
// itself), checks the clock, reads the shardfs.* keys of /proc/cmdline
// (ParseCmdline), loads the NIC modules the image lists in /etc/modules
// (finit_module, in the order netboot resolved from each module's
// .modinfo), brings up lo, runs DHCP on every eth*/en* interface with
// u-root's dhclient (address, routes, /etc/resolv.conf), reads the token
// that secrets.cpio.gz left in /secrets/token and removes the file, reaps
// orphans, and runs the node (runNode: shardfs serve's flags, Settings.Args). Every failure goes to the console; DHCP and
// the node are retried with a doubling backoff (1 s to 30 s) and Boot
// never returns on its own, since PID 1 exiting panics the kernel.
//
// Decisions:
//   - Bad keys: an unknown shardfs.* key, or shardfs.bot or shardfs.node
//     without shardfs.etcd, is printed and ignored. A missing or malformed
//     flavor or total, a malformed shards, listen, etcd, bot, node, api or
//     gateway, a key given twice with different values, shardfs.etcd
//     without shardfs.bot, a plain tcp! listener beyond loopback without
//     ,insecure (serve would refuse it, and the node would retry it
//     forever), and shardfs.token or SHARDFS_TOKEN (the token never goes
//     on the command line) refuse the node: the reason is repeated on the
//     console once a minute, the network stays up. netboot runs the same
//     check and refuses to write such an image.
//   - Three initrds: initrd.cpio.gz (no secret), tls.cpio.gz (the TLS
//     listener's certificate, key and client CA) and secrets.cpio.gz (the
//     token, and etcd's TLS files), the last two mode 0600 and each
//     optional in boot.ipxe (`initrd … || echo`). The listener's files
//     travel apart from the token so that a node whose secrets.cpio.gz is
//     missing still exports its tree and can say why it does nothing.
//   - Listeners: shardfs.listen, repeatable. Without it the node listens
//     on tls!0.0.0.0!5641 when tls.cpio.gz brought the TLS files
//     (/secrets/tls.crt, tls.key, client-ca.crt), and refuses otherwise:
//     the tree is never exported in the clear unless asked for.
//   - No token (secrets.cpio.gz absent, or made without --token-file):
//     the console says so, and the node still serves its tree on its
//     listeners (the default TLS one when tls.cpio.gz was loaded), every
//     shard FATAL with "no token", so the operator sees why over the
//     network. Such a node does not join etcd: it would take shards it
//     cannot run. A node that lacks tls.cpio.gz too has no TLS listener
//     and refuses to start unless the command line names a unix or
//     ,insecure one.
//   - A fleet node (shardfs.etcd, shardfs.bot, optional shardfs.node) runs
//     serve --etcd --bot --node, with --etcd-ca, --etcd-cert and
//     --etcd-key when secrets.cpio.gz brought /secrets/etcd-ca.crt,
//     etcd.crt and etcd.key. Without shardfs.node the node's name is the
//     host name DHCP gave (option 12), else pxe- and the NIC's hardware
//     address (pxe-52-54-00-12-34-56): the kernel's own host name is
//     "(none)" on every node, which would make every node the same member.
//   - The clock: the node trusts the RTC, which Debian's kernel reads at
//     boot (CONFIG_RTC_HCTOSYS). A clock before the build's commit time is
//     certainly wrong (a dead RTC battery); it is moved forward to that
//     time, as systemd does, and a warning says to set the RTC. There is
//     no NTP client: a node whose RTC drifts needs its RTC set.
//   - The DHCP lease is taken once and never renewed: give nodes static
//     reservations (or long leases), as for any PXE-booted appliance.
//   - /init is the running shardfs binary, which must be static
//     (CGO_ENABLED=0, the project's build); netboot refuses a dynamic one
//     rather than carrying a loader and libc.
//
// A Go panic in any goroutine of the node ends PID 1, which panics the
// kernel; the default command line's panic=10 reboots the node 10 s later.
//
// What it does not do: no disk (nothing is mounted from storage and
// nothing persists across a reboot: sessions are not saved locally), no
// NTP, no IPv6 DHCP, no shell or other process (the only children PID 1
// ever reaps are orphans), no module that is compressed (.ko.xz).
package baremetal
