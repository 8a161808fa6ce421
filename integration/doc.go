// Package integration boots Debian's Linux kernel in QEMU on an initramfs
// built in Go, so that tests can drive the kernel's own 9P client (v9fs)
// against a shardfs node served by the test process.
//
// A Kit locates what a boot needs on the host: qemu-system-x86_64, a static
// busybox, and Debian's kernel package unpacked (never installed) into
// $SHARDFS_KERNEL_DIR, /var/cache/shardfs/kernel by default; .ci/run puts it
// there. An Image is the guest's root file system as a table of files; its
// String is the plan, its WriteTo the gzipped cpio. Boot starts the guest
// with virtio-serial ports that are socketpairs to the test process (no
// ports, no paths, no start-order races) and returns the Machine with its
// console transcript. A guest may also have a virtio NIC on QEMU's user
// network with restrict=on (Config.NIC): TestV9fsTLS forwards a guest
// address to a TLS listener of the test process with guestfwd, QEMU
// running the test binary itself as the relay of each connection (see
// TestMain), so that the host needs no socat.
//
// Config.PXE boots instead from QEMU's restricted user-mode network
// through the NIC's iPXE ROM (Debian package ipxe-qemu): TestPXEBoot boots
// what `shardfs netboot` writes, with shardfs as PID 1, and drives the
// node's tree over TLS through a host forward.
//
// The tests skip when the kit is missing, except under CI=true, where a
// missing kit is a failure.
package integration
