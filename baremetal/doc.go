// Package baremetal is PID 1 of a PXE-booted shardfs node, and builds the
// netboot image that boots it.
//
// Boot mounts the pseudo file systems (RootFS, a table that prints
// itself), checks the clock, reads the shardfs.* keys of /proc/cmdline
// (ParseCmdline), loads the NIC modules the image lists in /etc/modules
// (finit_module, in the order netboot resolved from each module's
// .modinfo), brings up lo, runs DHCP on every eth*/en* interface with
// u-root's dhclient (address, routes, /etc/resolv.conf), enrolls with
// the enrollment server (package enroll: a key made at boot, its
// fingerprint on the console, the secrets once an operator approves it or
// a one-time code is typed on the console), reads the token enrollment
// left in /secrets/token and removes the file, reaps orphans, and runs the node (runNode: shardfs serve's flags, Settings.Args). Every failure goes to the console; DHCP and
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
//   - One initrd, no secret: initrd.cpio.gz holds the binary, the
//     modules, the CA bundle and the enrollment CA's certificate. The
//     token, the TLS listener's certificate and key (signed by the
//     enrollment server for the key the node made; the key never leaves
//     the node) and etcd's credentials come by enrollment (shardfs.enroll)
//     and live in the initramfs, that is in memory, mode 0600.
//   - Enrollment is retried with the backoff while the server cannot be
//     reached or refuses; a refusal of an already-enrolled key (a lost
//     reply) makes a new key, printed again. The console's echo is turned
//     off while the node waits, so that a typed code does not show.
//   - Listeners: shardfs.listen, repeatable. Without it the node listens
//     on tls!0.0.0.0!5641 once enrollment brought the TLS files
//     (/secrets/tls.crt, tls.key, client-ca.crt), and refuses otherwise:
//     the tree is never exported in the clear unless asked for.
//   - No token (no shardfs.enroll, or an enrollment server without
//     --token-file): the console says so, and the node still serves its
//     tree on its listeners, every shard FATAL with "no token", so the
//     operator sees why. Such a node does not join etcd: it would take
//     shards it cannot run. A node without shardfs.enroll has no TLS
//     listener and refuses to start unless the command line names a unix
//     or ,insecure one.
//   - A fleet node (shardfs.etcd, shardfs.bot, optional shardfs.node) runs
//     serve --etcd --bot --node, with --etcd-ca, --etcd-cert and
//     --etcd-key when enrollment brought /secrets/etcd-ca.crt,
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
