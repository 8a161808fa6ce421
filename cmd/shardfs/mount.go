package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/fsrv"
)

// runMount mounts the tree with Linux v9fs through a relay, as diodmount
// does for diod: it connects (and, for tls!, authenticates) in user space,
// mounts with trans=fd on one end of a socketpair and copies between the
// other end and the connection, in the foreground until the file system
// is unmounted.
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
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := fsrv.Dial(dctx, addr, conf)
	cancel()
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	m := &mount{addr: addr, dir: dir, conn: conn, ro: *ro, aname: *aname, access: *access}
	return m.run(ctx, stdout, stderr)
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

// mountTimeout bounds mount(2): the kernel's 9P version and attach
// exchanges through the relay.
const mountTimeout = 30 * time.Second

type mount struct {
	addr, dir string
	conn      net.Conn
	ro        bool
	aname     string
	access    string
}

// options are the v9fs mount options for the kernel's end of the pair.
func (m *mount) options(fd int) string {
	o := fmt.Sprintf("trans=fd,rfdno=%d,wfdno=%d,version=9p2000.L,access=%s", fd, fd, m.access)
	if m.aname != "" {
		o += ",aname=" + m.aname
	}
	return o
}

func (m *mount) flags() uintptr {
	f := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if m.ro {
		f |= unix.MS_RDONLY
	}
	return f
}

// relay copies between the kernel's side and the server until either
// ends. Its result says which ended first and why.
type relayEnd struct {
	kernel bool  // the kernel closed its end: the file system is unmounted
	err    error // the server's side failed (nil: it closed)
}

// relay runs the two directions. Which side ended is told by where the
// copy failed, reading or writing: after an unmount, a reply still on
// its way from the server meets the kernel's closed end. The first
// direction to end closes both connections, so that a kernel waiting in
// mount(2) for a server that refused us sees EOF and fails.
func relay(kernel, server net.Conn) <-chan relayEnd {
	out := make(chan relayEnd, 2)
	var once sync.Once
	end := func(e relayEnd) {
		first := false
		once.Do(func() {
			out <- e // before the close makes the other direction end
			first = true
			kernel.Close()
			server.Close()
		})
		if !first {
			out <- e
		}
	}
	go func() {
		if _, werr := pump(server, kernel); werr != nil {
			end(relayEnd{err: werr})
			return
		}
		end(relayEnd{kernel: true})
	}()
	go func() {
		rerr, werr := pump(kernel, server)
		if werr != nil {
			end(relayEnd{kernel: true})
			return
		}
		if errors.Is(rerr, io.EOF) {
			rerr = nil
		}
		end(relayEnd{err: rerr})
	}()
	return out
}

// pump copies src to dst until one fails, and says which.
func pump(dst, src net.Conn) (readErr, writeErr error) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return nil, werr
			}
		}
		if err != nil {
			return err, nil
		}
	}
}

func (m *mount) run(ctx context.Context, stdout, stderr io.Writer) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		m.conn.Close()
		return fmt.Errorf("mount: socketpair: %w", err)
	}
	kfd := fds[0]
	f := os.NewFile(uintptr(fds[1]), "v9fs-relay")
	ours, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(kfd)
		m.conn.Close()
		return fmt.Errorf("mount: %w", err)
	}
	closeAll := func() { ours.Close(); m.conn.Close() }
	ends := relay(ours, m.conn)

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// The kernel waits for the server's answers in mount(2) and only
	// SIGKILL interrupts it: a server that accepted us and then says
	// nothing, or a signal meanwhile, ends the wait by closing the relay.
	var timedOut atomic.Bool
	timer := time.AfterFunc(mountTimeout, func() { timedOut.Store(true); closeAll() })
	interrupt := context.AfterFunc(ctx, closeAll)
	err = unix.Mount(m.addr, m.dir, "9p", m.flags(), m.options(kfd))
	timer.Stop()
	interrupted := !interrupt()
	unix.Close(kfd) // the kernel holds its own reference now
	if err == nil && (interrupted || timedOut.Load()) {
		unix.Unmount(m.dir, unix.MNT_DETACH)
		err = unix.EINTR
	}
	if err != nil {
		closeAll()
		why := fmt.Errorf("mount -t 9p %s %s: %w", m.addr, m.dir, err)
		switch {
		case timedOut.Load():
			return fmt.Errorf("%w: the server did not answer within %v", why, mountTimeout)
		case interrupted:
			return fmt.Errorf("%w: interrupted", why)
		}
		switch {
		case errors.Is(err, unix.EPERM):
			why = fmt.Errorf("%w (mounting needs root or CAP_SYS_ADMIN)", why)
		case errors.Is(err, unix.ENODEV):
			why = fmt.Errorf("%w (the kernel has no 9p file system: modprobe 9p)", why)
		}
		// The server's refusal explains a mount that failed.
		for range 2 {
			if e := <-ends; e.err != nil && !errors.Is(e.err, net.ErrClosed) {
				return fmt.Errorf("%w: %v", why, e.err)
			}
		}
		return why
	}
	fmt.Fprintf(stdout, "mounted %s on %s; umount %s or interrupt to end\n", m.addr, m.dir, m.dir)

	// A signal also ends ctx (main's NotifyContext): signals are counted
	// on sigs alone, and ctx only starts the unmount.
	unmounting, signals := false, 0
	for {
		select {
		case e := <-ends:
			closeAll()
			if e.kernel {
				fmt.Fprintf(stdout, "%s unmounted\n", m.dir)
				return nil
			}
			// The server went away: nothing can serve the mount again.
			unix.Unmount(m.dir, unix.MNT_DETACH)
			why := "the server closed the connection"
			if e.err != nil {
				why = e.err.Error()
			}
			return fmt.Errorf("mount: connection to %s lost (%s); %s detached", m.addr, why, m.dir)
		case <-sigs:
			if signals++; signals > 1 {
				closeAll()
				return fmt.Errorf("mount: interrupted again: relay ended with %s detached but in use; its open files now fail", m.dir)
			}
			if !unmounting {
				unmounting = true
				m.unmount(stderr)
			}
		case <-ctx.Done():
			if !unmounting {
				unmounting = true
				m.unmount(stderr)
			}
			ctx = context.Background() // once
		}
	}
}

// unmount unmounts, or detaches a busy mount.
func (m *mount) unmount(stderr io.Writer) {
	err := unix.Unmount(m.dir, 0)
	if errors.Is(err, unix.EBUSY) {
		fmt.Fprintf(stderr, "shardfs: %s is busy: detached; the relay serves its open files until they close (interrupt again to end it now)\n", m.dir)
		err = unix.Unmount(m.dir, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		fmt.Fprintf(stderr, "shardfs: umount %s: %v\n", m.dir, err)
	}
}
