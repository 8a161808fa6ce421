package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
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

// servePeerTCP listens on a loopback port, says which, and accepts
// until killed, keeping what it accepted open.
func servePeerTCP() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(2)
	}
	os.Stdout.WriteString(l.Addr().String() + "\n")
	var held []net.Conn
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(0)
		}
		held = append(held, c)
	}
}

// runAsNobody runs this test binary as uid 65534, from a folder it can
// reach, with the environment env gives for that folder, and returns the
// folder and the binary's stdout.
func runAsNobody(t *testing.T, env func(dir string) string) (dir string, out io.Reader) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a server as another user")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err = os.MkdirTemp("", "peer-")
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
	cmd := exec.Command(bin)
	cmd.Env = []string{env(dir)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return dir, stdout
}

// TestLoopbackPeerOtherUID: a loopback TCP port served by another user
// (this test binary, run as nobody, as a local user who bound 5640 before
// the node) is refused by DialConn, naming the uid; one served by this
// user is not.
func TestLoopbackPeerOtherUID(t *testing.T) {
	_, out := runAsNobody(t, func(string) string { return "SHARDFS_TEST_PEER_SERVE_TCP=1" })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the server as uid 65534 did not start: %v", err)
	}
	addr := strings.TrimSpace(line)
	host, port, _ := net.SplitHostPort(addr)
	c, err := DialConn(context.Background(), "tcp!"+host+"!"+port, nil)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, ErrPeerUID) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("DialConn(tcp!%s!%s served by uid 65534) = %v; want ErrPeerUID naming uid 65534", host, port, err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	host, port, _ = net.SplitHostPort(l.Addr().String())
	c, err = DialConn(context.Background(), "tcp!"+host+"!"+port, nil)
	if err != nil {
		t.Fatalf("DialConn(a loopback port of uid %d) = %v", os.Getuid(), err)
	}
	c.Close()
}

// The server's end of a loopback connection is found in /proc/net/tcp
// and tcp6 by its addresses, or by the listening socket; nothing found
// is an error, never uid 0.
func TestServerUID(t *testing.T) {
	le := binary.NativeEndian.Uint32([]byte{127, 0, 0, 1}) == 0x0100007F
	if !le {
		t.Skip("the table below is written for a little-endian machine")
	}
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1608 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 11 1 0 100 0 0 10 0
   1: 0100007F:1608 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 12 1 0 20 4 30 10 -1
   2: 0100007F:9C40 0100007F:1608 01 00000000:00000000 00:00000000 00000000  1000        0 13 1 0 20 4 30 10 -1
   3: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 14 1 0 100 0 0 10 0
`
	table6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:A000 01 00000000:00000000 00:00000000 00000000  1003        0 15 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:22B8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1004        0 16 1 0 100 0 0 10 0
`
	socks, err := parseProcNetTCP(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	s6, err := parseProcNetTCP(strings.NewReader(table6))
	if err != nil {
		t.Fatal(err)
	}
	socks = append(socks, s6...)
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		local, remote string
		uid           uint32
		ok            bool
	}{
		{"127.0.0.1:40000", "127.0.0.1:5640", 1001, true}, // the accepted socket
		{"127.0.0.1:40001", "127.0.0.1:5640", 1001, true}, // not accepted yet: the listener
		{"127.0.0.1:40960", "127.0.0.1:8080", 1003, true}, // a dual-stack server's accepted socket
		{"127.0.0.1:40961", "127.0.0.1:8080", 1002, true}, // 0.0.0.0:8080 listens
		{"[::1]:40000", "[::1]:8888", 1004, true},
		{"127.0.0.1:40000", "127.0.0.1:5641", 0, false},
	} {
		uid, err := serverUID(socks, ap(tc.local), ap(tc.remote))
		if (err == nil) != tc.ok || uid != tc.uid {
			t.Errorf("serverUID(%s -> %s) = %d, %v; want %d (found: %t)", tc.local, tc.remote, uid, err, tc.uid, tc.ok)
		}
	}
	if _, err := parseProcNetTCP(strings.NewReader("header\n 0: zz:1608 00000000:0000 0A 0:0 0:0 0 1000 0 1\n")); err == nil {
		t.Error("parseProcNetTCP(a bad address) = nil error; want one")
	}
}

// TestPeerOtherUID: a socket served by another user (this test binary,
// run as nobody) is refused by DialConn, naming the uid.
func TestPeerOtherUID(t *testing.T) {
	dir, out := runAsNobody(t, func(dir string) string { return "SHARDFS_TEST_PEER_SERVE=" + filepath.Join(dir, "s.sock") })
	sock := filepath.Join(dir, "s.sock")
	line := make([]byte, len("listening\n"))
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatalf("the server as uid 65534 did not start: %v", err)
	}
	_, err := DialConn(context.Background(), "unix!"+sock, nil)
	if !errors.Is(err, ErrPeerUID) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("DialConn(a socket of uid 65534) = %v; want ErrPeerUID naming uid 65534", err)
	}
}
