package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/shardfs/shardfs/client"
)

// runMount mounts the tree with Linux v9fs through a relay, as diodmount
// does for diod: it connects (and, for tls!, authenticates) in user space,
// mounts with trans=fd on one end of a socketpair and copies between the
// other end and the connection (client.Mount), in the foreground until
// the file system is unmounted.
//
// Decisions. The mount is nosuid,nodev always, and access=UID by
// default: v9fs shows the tree's files rw-rw-rw-, so without it every
// local user could write ctl through the mount; UID is the caller's, or
// under sudo the user who ran sudo. A signal unmounts; a mount in use is
// detached (MNT_DETACH) and the relay serves its open files until they
// close; a second signal ends the relay at once (the open files then fail
// with EIO). A connection lost to the server cannot be resumed (9P's fids
// live in the connection): the mount is detached and mount exits 1. The
// kernel's wait in mount(2) yields to SIGKILL alone, so mount closes the
// relay itself when a signal comes or the server has not answered within
// 30 s, which makes mount(2) fail.
func runMount(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("mount", flag.ContinueOnError)
	fl.SetOutput(stderr)
	ro := fl.Bool("ro", false, "mount read-only")
	aname := fl.String("aname", "", "the directory of the tree to mount, such as /3 (default: the root)")
	access := fl.String("access", defaultAccess(), "v9fs access mode: a UID (only that user may use the mount), user, or any")
	var cf clientTLSFlags
	cf.register(fl)
	// Flags may follow the arguments: shardfs mount ADDR DIR --ro.
	var pos []string
	for {
		if err := fl.Parse(args); err != nil {
			return err
		}
		if fl.NArg() == 0 {
			break
		}
		pos = append(pos, fl.Arg(0))
		args = fl.Args()[1:]
	}
	if len(pos) != 2 {
		return flagErr(fl, "mount needs ADDR and DIR, got %d arguments", len(pos))
	}
	addr, dir := pos[0], pos[1]
	if *access != "user" && *access != "any" {
		if _, err := strconv.ParseUint(*access, 10, 32); err != nil {
			return flagErr(fl, "--access %q: want a UID, user or any", *access)
		}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("mount: %s is not a directory", dir)
	}
	conf, err := cf.config(addr)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, client.MountTimeout)
	conn, err := client.DialConn(dctx, addr, conf)
	cancel()
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	m, err := client.Mount(ctx, conn, client.MountConfig{Source: addr, Dir: dir, ReadOnly: *ro, Aname: *aname, Access: *access})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mounted %s on %s; umount %s or interrupt to end\n", addr, dir, dir)

	// A signal also ends ctx (main's NotifyContext): signals are counted
	// on sigs alone, and ctx only starts the unmount.
	unmounting, signals := false, 0
	unmount := func() {
		if unmounting {
			return
		}
		unmounting = true
		detached, err := m.Unmount()
		if detached {
			fmt.Fprintf(stderr, "shardfs: %s is busy: detached; the relay serves its open files until they close (interrupt again to end it now)\n", dir)
		}
		if err != nil {
			fmt.Fprintf(stderr, "shardfs: %v\n", err)
		}
	}
	for {
		select {
		case <-m.Done():
			if err := m.Err(); err != nil {
				return fmt.Errorf("mount: %w", err)
			}
			fmt.Fprintf(stdout, "%s unmounted\n", dir)
			return nil
		case <-sigs:
			if signals++; signals > 1 {
				m.Close()
				return fmt.Errorf("mount: interrupted again: relay ended with %s detached but in use; its open files now fail", dir)
			}
			unmount()
		case <-ctx.Done():
			unmount()
			ctx = context.Background() // once
		}
	}
}

// defaultAccess is the UID of the user who asked for the mount.
func defaultAccess() string {
	if os.Getuid() == 0 {
		if u := os.Getenv("SUDO_UID"); u != "" {
			return u
		}
	}
	return strconv.Itoa(os.Getuid())
}
