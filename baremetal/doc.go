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
// orphans, and runs the node. Every failure goes to the console; DHCP and
// the node are retried with a doubling backoff (1 s to 30 s) and Boot
// never returns on its own, since PID 1 exiting panics the kernel.
//
// Decisions:
//   - Bad keys: an unknown shardfs.* key, or shardfs.bot without
//     shardfs.etcd, is printed and ignored. A missing or malformed flavor
//     or total, a malformed shards, listen, api or gateway, a key given
//     twice with different values, shardfs.etcd (serve has no etcd
//     ownership yet, so the node could duplicate shards other nodes own)
//     and shardfs.token or SHARDFS_TOKEN (the token never goes on the
//     command line) refuse the node: the reason is repeated on the console
//     once a minute, the network stays up.
//   - Listeners: shardfs.listen, repeatable. Without it the node listens
//     on tls!0.0.0.0!5641 when secrets.cpio.gz brought the TLS files
//     (/secrets/tls.crt, tls.key, client-ca.crt), and refuses otherwise:
//     the tree is never exported in the clear unless asked for.
//   - No token (secrets.cpio.gz absent): the node still serves its tree and
//     every shard is FATAL with "no token", so the operator sees why over
//     the network.
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
// What it does not do: no disk (nothing is mounted from storage and
// nothing persists across a reboot: sessions are not saved locally), no
// NTP, no IPv6 DHCP, no shell or other process (the only children PID 1
// ever reaps are orphans), no module that is compressed (.ko.xz).
package baremetal
