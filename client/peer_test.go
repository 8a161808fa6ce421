package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardfs/shardfs/fsrv"
)

// A unix socket served by another user is refused, one served by this
// user or root is not; DialConn reads the server's uid from the kernel.
func TestPeerUID(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		me   int
		want error
	}{
		{1000, 1000, nil},
		{0, 1000, nil},
		{0, 0, nil},
		{1001, 1000, ErrPeerUID},
		{1000, 0, ErrPeerUID},
	} {
		if err := checkPeerUID(tc.uid, 42, tc.me); !errors.Is(err, tc.want) {
			t.Errorf("checkPeerUID(server uid %d, me %d) = %v; want %v", tc.uid, tc.me, err, tc.want)
		}
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := fsrv.Listen("unix!" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := DialConn(context.Background(), "unix!"+sock, nil)
	if err != nil {
		t.Fatalf("DialConn(a socket of uid %d) = %v", os.Getuid(), err)
	}
	c.Close()
}
