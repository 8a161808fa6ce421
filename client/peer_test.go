package client

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// A client refused for a full server says so, over a unix socket (an
// ENFILE to its Tversion) and over TLS (an alert before the handshake).
func TestServerFull(t *testing.T) {
	pki := testPKI(t)
	root := &fsrv.Dir{Name: "/", List: func() []fsrv.File {
		return []fsrv.File{&fsrv.Text{Name: "status", Content: func() []byte { return []byte("READY\n") }}}
	}}
	srv := &fsrv.Server{Root: root}
	sock := "unix!" + filepath.Join(t.TempDir(), "s.sock")
	ul, err := fsrv.Listen(sock + ",max=1")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := fsrv.ServerTLSConfig(filepath.Join(pki, "server.crt"), filepath.Join(pki, "server.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	tl, err := fsrv.ListenTLS("tls!127.0.0.1!0,max=1", conf)
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := fsrv.AddrString(tl)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range []net.Listener{ul, tl} {
		wg.Go(func() { srv.Serve(ctx, l) })
	}
	defer func() { cancel(); wg.Wait() }()
	cc, err := fsrv.ClientTLSConfig(filepath.Join(pki, "client.crt"), filepath.Join(pki, "client.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{sock, tlsAddr} {
		first, err := Dial(ctx, addr, WithTLS(cc))
		if err != nil {
			t.Fatalf("Dial(%s), the first: %v", addr, err)
		}
		defer first.Close()
		_, err = Dial(ctx, addr, WithTLS(cc))
		if !errors.Is(err, fsrv.ErrServerFull) || !strings.Contains(err.Error(), "server full") {
			t.Errorf("Dial(%s) past its max=1 = %v; want an error saying server full", addr, err)
		}
	}
}

// servePeer listens on sock and accepts until killed.
func servePeer(sock string) {
	l, err := net.Listen("unix", sock)
	if err != nil {
		os.Exit(2)
	}
	os.Stdout.WriteString("listening\n")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(0)
		}
		c.Close()
	}
}

// TestPeerOtherUID: a socket served by another user (this test binary,
// run as nobody) is refused by DialConn, naming the uid.
func TestPeerOtherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a server as another user")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A folder nobody can reach: the test binary and the socket.
	dir, err := os.MkdirTemp("", "peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	cmd := exec.Command(bin)
	cmd.Env = []string{"SHARDFS_TEST_PEER_SERVE=" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, len("listening\n"))
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatalf("the server as uid 65534 did not start: %v", err)
	}
	_, err = DialConn(context.Background(), "unix!"+sock, nil)
	if !errors.Is(err, ErrPeerUID) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("DialConn(a socket of uid 65534) = %v; want ErrPeerUID naming uid 65534", err)
	}
}
