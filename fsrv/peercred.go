package fsrv

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerCred returns the credentials of the process at the other end of a
// unix socket, as the kernel recorded them at connect (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return cred, nil
}
