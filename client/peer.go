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

// ErrPeerUID is the error of a unix socket served by a process of
// another user than this one (or root).
var ErrPeerUID = errors.New("the socket is served by another user")

// DialConn connects to addr as fsrv.Dial does, and refuses a unix socket
// whose server runs as another user than this process, by the kernel's
// word (SO_PEERCRED): a socket in a folder another user can write may
// have been put there to collect the commands and files meant for the
// tree. A server running as root is accepted: root can read this user's
// files and processes anyway, and /run/shardfs.sock is root's.
func DialConn(ctx context.Context, addr string, conf *tls.Config) (net.Conn, error) {
	conn, err := fsrv.Dial(ctx, addr, conf)
	if err != nil {
		return nil, err
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
