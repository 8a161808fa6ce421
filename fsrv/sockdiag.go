package fsrv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// errNoPeer is the error of socketOwner when no process of this host
// holds the socket.
var errNoPeer = errors.New("no process of this host holds the socket")

// socketOwner is the uid that owns this host's TCP socket whose own
// address is local and whose peer is remote, by the kernel's word: an
// exact lookup through NETLINK_SOCK_DIAG (what ss(8) reads; the same
// owner as /proc/net/tcp's uid column, without reading the whole table
// at every accept). The kernel keeps no SO_PEERCRED for TCP. A socket
// that no process holds any more (closed, or a TIME_WAIT entry, whose
// owner the kernel reports as 0) is errNoPeer: a client that sent its
// requests and closed must not pass for root.
func socketOwner(local, remote netip.AddrPort) (uint32, error) {
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	uid, err := sockDiag(unix.AF_INET, local, remote)
	if errors.Is(err, errNoPeer) && local.Addr().Is4() && remote.Addr().Is4() {
		// A dual-stack client socket sees IPv4 as ::ffff:a.b.c.d.
		m := func(a netip.AddrPort) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom16(a.Addr().As16()), a.Port())
		}
		uid, err = sockDiag(unix.AF_INET6, m(local), m(remote))
	}
	return uid, err
}

// sockDiag asks for one socket of family (inet_diag_req_v2 with an
// exact inet_diag_sockid; linux/inet_diag.h).
func sockDiag(family int, local, remote netip.AddrPort) (uint32, error) {
	if family == unix.AF_INET && !(local.Addr().Is4() && remote.Addr().Is4()) {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)

	const reqLen = unix.SizeofNlMsghdr + 56
	req := make([]byte, reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], reqLen)
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	b := req[unix.SizeofNlMsghdr:]
	b[0], b[1] = byte(family), unix.IPPROTO_TCP
	ne.PutUint32(b[4:], ^uint32(0)) // every state
	id := b[8:]
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	if family == unix.AF_INET {
		l, r := local.Addr().As4(), remote.Addr().As4()
		copy(id[4:], l[:])
		copy(id[20:], r[:])
	} else {
		l, r := local.Addr().As16(), remote.Addr().As16()
		copy(id[4:], l[:])
		copy(id[20:], r[:])
	}
	ne.PutUint32(id[40:], ^uint32(0)) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], ^uint32(0))
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	if n < unix.SizeofNlMsghdr {
		return 0, fmt.Errorf("sock_diag: a reply of %d bytes", n)
	}
	body := buf[unix.SizeofNlMsghdr:n]
	switch ne.Uint16(buf[4:]) {
	case unix.NLMSG_ERROR:
		if len(body) < 4 {
			return 0, fmt.Errorf("sock_diag: a short error")
		}
		errno := unix.Errno(-int32(ne.Uint32(body)))
		if errno == unix.ENOENT {
			return 0, fmt.Errorf("%w: %v -> %v", errNoPeer, local, remote)
		}
		return 0, fmt.Errorf("sock_diag: %w", errno)
	case unix.SOCK_DIAG_BY_FAMILY:
	default:
		return 0, fmt.Errorf("sock_diag: a reply of type %d", ne.Uint16(buf[4:]))
	}
	// inet_diag_msg: family, state, timer, retrans, the 48-byte id,
	// expires, rqueue, wqueue, uid, inode.
	if len(body) < 72 {
		return 0, fmt.Errorf("sock_diag: a reply of %d bytes", len(body))
	}
	uid, inode := ne.Uint32(body[64:]), ne.Uint32(body[68:])
	if inode == 0 {
		return 0, fmt.Errorf("%w: %v -> %v (closed)", errNoPeer, local, remote)
	}
	return uid, nil
}
