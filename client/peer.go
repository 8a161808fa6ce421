package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/shardfs/shardfs/fsrv"
)

// ErrPeerUID is the error of a unix socket or loopback TCP port served
// by a process of another user than this one (or root).
var ErrPeerUID = errors.New("the socket is served by another user")

// DialConn connects to addr as fsrv.Dial does, and refuses a unix socket
// whose server runs as another user than this process, by the kernel's
// word (SO_PEERCRED): a socket in a folder another user can write may
// have been put there to collect the commands and files meant for the
// tree. A server running as root is accepted: root can read this user's
// files and processes anyway, and /run/shardfs.sock is root's.
//
// Plain TCP to a loopback address gets the same check, through the
// owner of the server's socket in /proc/net/tcp: any local user can bind
// tcp!127.0.0.1!5640 while no node holds it, and the client falls back
// to it. A TLS address needs no check: the server's certificate says who
// it is.
func DialConn(ctx context.Context, addr string, conf *tls.Config) (net.Conn, error) {
	conn, err := fsrv.Dial(ctx, addr, conf)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		if err := checkLoopbackTCP(tc, os.Getuid()); err != nil {
			conn.Close()
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
		return conn, nil
	}
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return conn, nil
	}
	cred, err := fsrv.PeerCred(uc)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: the server's credentials (SO_PEERCRED): %w", addr, err)
	}
	if err := checkPeerUID(cred.Uid, cred.Pid, os.Getuid()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	return conn, nil
}

func checkPeerUID(uid uint32, pid int32, me int) error {
	if int64(uid) != int64(me) && uid != 0 {
		return fmt.Errorf("%w: uid %d (pid %d), not uid %d or root; remove the socket or dial another address", ErrPeerUID, uid, pid, me)
	}
	return nil
}

// checkLoopbackTCP refuses a loopback TCP connection whose server's
// socket another user owns (see loopbackServerUID). A server it cannot
// find is refused too: the check fails closed.
func checkLoopbackTCP(c *net.TCPConn, me int) error {
	remote := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	if !remote.Addr().Unmap().IsLoopback() {
		return nil
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	uid, err := loopbackServerUID(local, remote)
	if err != nil {
		return fmt.Errorf("who serves the loopback port cannot be told, so it is not trusted: %w", err)
	}
	if int64(uid) != int64(me) && uid != 0 {
		return fmt.Errorf("%w: uid %d serves the loopback port %d, not uid %d or root; another local user may have bound it first: stop it, or dial the node's unix socket", ErrPeerUID, uid, remote.Port(), me)
	}
	return nil
}
