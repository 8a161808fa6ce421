package fsrv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hugelgupf/p9/linux"
)

// ErrLocalPeerUID is why a read-write plain TCP listener refuses a
// connection from this host: its client's socket belongs to another user
// than the server's (or root), or cannot be found.
var ErrLocalPeerUID = errors.New("a read-write TCP listener serves only the server's own user and root on this host")

// checkLocalPeer admits a connection accepted on a read-write plain TCP
// listener only from the server's own user or root when it comes from
// this host. Any local user can connect to tcp!127.0.0.1!PORT, and such a
// listener takes every command (stop, approve): without this check it
// gave the tree to every account of the machine (attack report 21b,
// finding 4). The kernel keeps no SO_PEERCRED for TCP, so the owner of
// the client's socket is asked of the kernel by the connection's
// addresses (socketOwner), as the client checks the server's
// (client.DialConn). A peer from this host (loopback, or an address of
// this host's interfaces) whose socket is not found is refused: the check
// fails closed. A peer from another address is another machine (a
// ",insecure" listener), which this check cannot name.
func checkLocalPeer(c *net.TCPConn, me int) error {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	remote := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	uid, err := socketOwner(remote, local) // the client's socket
	switch {
	case errors.Is(err, errNoPeer) && !isHostAddr(remote.Addr()):
		return nil
	case err != nil:
		return fmt.Errorf("%w: the owner of %v cannot be told: %v", ErrLocalPeerUID, remote, err)
	case int64(uid) != int64(me) && uid != 0:
		return fmt.Errorf("%w: %v is uid %d, not uid %d or root; use the unix socket, or a ,ro listener", ErrLocalPeerUID, remote, uid, me)
	}
	return nil
}

// refuseLocalPeer answers c's Tversion with EACCES (9P2000.L) or the
// reason (9P2000), within tellTimeout, and closes c.
func refuseLocalPeer(c net.Conn, why error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(tellTimeout))
	refuseVersion(c, linux.EACCES, clipEname("permission denied: "+why.Error(), MinMsize))
}

// refuseVersion reads c's Tversion and answers it with errno (9P2000.L)
// or ename (9P2000); a connection that sends no Tversion gets nothing.
func refuseVersion(c net.Conn, errno linux.Errno, ename string) {
	frame, err := readFrame(bufio.NewReaderSize(c, 64), maxVersionFrame)
	if err != nil {
		return
	}
	t, err := parseVersion(frame)
	if err != nil {
		return
	}
	if dialectOf(t.version) == dialectDotL {
		c.Write(rlerror(t.tag, errno))
	} else {
		c.Write(rerror(t.tag, ename))
	}
}

// localPeerRefused logs a refusal of checkLocalPeer, at most once a
// minute.
func (s *Server) localPeerRefused(remote string, why error) {
	skipped, ok := s.rateLimit("local peer uid")
	if !ok {
		return
	}
	args := []any{"remote", remote, "err", why}
	if skipped > 0 {
		args = append(args, "more_refused", skipped)
	}
	s.logger().Warn("fsrv: connection refused", args...)
}

// isHostAddr tells whether a is loopback or an address of one of this
// host's interfaces (any local user may bind it as a source).
func isHostAddr(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // unknown: fail closed
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}
