package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// MountConfig says where and how Mount mounts a tree.
type MountConfig struct {
	// Source is the mount's source in /proc/mounts and in errors: the
	// address the connection was dialled to.
	Source string
	Dir    string
	// ReadOnly mounts with MS_RDONLY.
	ReadOnly bool
	// Aname is the directory of the tree to mount, such as /3; "" is the
	// root.
	Aname string
	// Access is v9fs's access= option: a UID (only that user may use the
	// mount), "user" or "any"; "" is the caller's UID. v9fs shows the
	// tree's files rw-rw-rw-, so with "any" every local user could write
	// ctl through the mount.
	Access string
}

// MountTimeout bounds mount(2): the kernel's 9P version and attach
// exchanges through the relay.
const MountTimeout = 30 * time.Second

// Mountpoint is a tree mounted by Mount, served by its Relay until the
// file system is unmounted or the connection is lost.
type Mountpoint struct {
	cfg   MountConfig
	relay *Relay
	done  chan struct{}
	err   error // written before done is closed
	// closing is set by Close: the relay's end is then ours, not a
	// lost connection.
	closing atomic.Bool
}

// Mount mounts the tree at the other end of conn on cfg.Dir with Linux
// v9fs, trans=fd on one end of a socket pair whose other end a Relay
// joins to conn. It returns once mount(2) has: the tree is then mounted,
// nosuid and nodev. It needs root or CAP_SYS_ADMIN. The kernel's wait in
// mount(2) yields to SIGKILL alone, so Mount ends the relay itself, which
// makes mount(2) fail, when ctx ends or the server has not answered
// within MountTimeout. The Mountpoint owns conn, even when Mount fails.
//
// The mount(2) call lives here rather than in the command because the
// relay is useless without it: the kernel's end of the pair must reach
// mount(2) as an fd number in the same process.
func Mount(ctx context.Context, conn net.Conn, cfg MountConfig) (*Mountpoint, error) {
	if cfg.Access == "" {
		cfg.Access = strconv.Itoa(os.Getuid())
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("mount: socketpair: %w", err)
	}
	kfd := fds[0]
	f := os.NewFile(uintptr(fds[1]), "v9fs-relay")
	ours, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(kfd)
		conn.Close()
		return nil, fmt.Errorf("mount: %w", err)
	}
	r := NewRelay(ours, conn)

	// A server that accepted us and then says nothing, or ctx ending
	// meanwhile, ends the kernel's wait by closing the relay.
	var timedOut atomic.Bool
	timer := time.AfterFunc(MountTimeout, func() { timedOut.Store(true); r.shut() })
	interrupt := context.AfterFunc(ctx, r.shut)
	err = unix.Mount(cfg.Source, cfg.Dir, "9p", mountFlags(cfg), mountOptions(cfg, kfd))
	timer.Stop()
	interrupted := !interrupt()
	unix.Close(kfd) // the kernel holds its own reference now
	if err == nil && (interrupted || timedOut.Load()) {
		unix.Unmount(cfg.Dir, unix.MNT_DETACH)
		err = unix.EINTR
	}
	if err != nil {
		why := fmt.Errorf("mount -t 9p %s %s: %w", cfg.Source, cfg.Dir, err)
		refusal := r.refusal()
		switch {
		case timedOut.Load():
			return nil, fmt.Errorf("%w: the server did not answer within %v", why, MountTimeout)
		case interrupted:
			return nil, fmt.Errorf("%w: interrupted", why)
		}
		switch {
		case errors.Is(err, unix.EPERM):
			why = fmt.Errorf("%w (mounting needs root or CAP_SYS_ADMIN)", why)
		case errors.Is(err, unix.ENODEV):
			why = fmt.Errorf("%w (the kernel has no 9p file system: modprobe 9p)", why)
		}
		if refusal != nil {
			return nil, fmt.Errorf("%w: %v", why, refusal)
		}
		return nil, why
	}
	m := &Mountpoint{cfg: cfg, relay: r, done: make(chan struct{})}
	go m.watch()
	return m, nil
}

// watch waits for the relay to end. A connection lost to the server
// cannot be resumed (9P's fids live in the connection), so the mount is
// detached: nothing can serve it again.
func (m *Mountpoint) watch() {
	defer close(m.done)
	<-m.relay.Done()
	m.relay.Close()
	err := m.relay.Err()
	if err == nil || m.closing.Load() {
		return
	}
	unix.Unmount(m.cfg.Dir, unix.MNT_DETACH)
	why := err.Error()
	if errors.Is(err, io.EOF) {
		why = "the server closed the connection"
	}
	m.err = fmt.Errorf("connection to %s lost (%s); %s detached", m.cfg.Source, why, m.cfg.Dir)
}

// mountOptions are the v9fs mount options for the kernel's end of the
// pair.
func mountOptions(cfg MountConfig, fd int) string {
	o := fmt.Sprintf("trans=fd,rfdno=%d,wfdno=%d,version=9p2000.L,access=%s", fd, fd, cfg.Access)
	if cfg.Aname != "" {
		o += ",aname=" + cfg.Aname
	}
	return o
}

func mountFlags(cfg MountConfig) uintptr {
	f := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if cfg.ReadOnly {
		f |= unix.MS_RDONLY
	}
	return f
}

// Done is closed when the relay has ended: the file system was unmounted,
// or the connection was lost.
func (m *Mountpoint) Done() <-chan struct{} { return m.done }

// Err says why, once Done is closed: nil when the file system was
// unmounted, else the lost connection (the mount is then detached).
func (m *Mountpoint) Err() error {
	<-m.done
	return m.err
}

// Unmount unmounts the tree, or detaches it when it is busy: the relay
// then serves its open files until they close, and Done waits for that.
// detached says which.
func (m *Mountpoint) Unmount() (detached bool, err error) {
	err = unix.Unmount(m.cfg.Dir, 0)
	if errors.Is(err, unix.EBUSY) {
		detached = true
		err = unix.Unmount(m.cfg.Dir, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return detached, fmt.Errorf("umount %s: %w", m.cfg.Dir, err)
	}
	return detached, nil
}

// Close ends the relay at once; files still open on a detached mount
// then fail with EIO. It waits for the relay.
func (m *Mountpoint) Close() error {
	m.closing.Store(true)
	m.relay.shut()
	<-m.done
	return nil
}
