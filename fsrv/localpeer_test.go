package fsrv

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dialAsPeer is TestLocalPeerUID's client process: it starts a 9P2000.L
// session on the address in FSRV_TEST_DIAL, reads status, and prints
// "READY" or the error.
func dialAsPeer(t *testing.T, addr string) {
	c, err := net.DialTimeout("tcp", addr, time.Minute)
	if err != nil {
		os.Stdout.WriteString("dial: " + err.Error() + "\n")
		return
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	s, err := readStatusOver(c)
	if err != nil {
		os.Stdout.WriteString("session: " + err.Error() + "\n")
		return
	}
	os.Stdout.WriteString(strings.TrimSpace(s) + "\n")
}

// runPeerAs runs this test binary as uid, from a folder it can reach,
// as the client of addr, and returns what it printed.
func runPeerAs(t *testing.T, uid int, addr string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "localpeer-") // t.TempDir's parent is 0700
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "fsrv.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang's bound
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestLocalPeerUID$")
	cmd.Env = []string{"FSRV_TEST_DIAL=" + addr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the client as uid %d: %v\n%s", uid, err, out)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}

// TestLocalPeerUID: attack report 21b finding 4. A read-write loopback
// TCP listener refuses a client of another local user (uid 65534) and
// serves the server's own; a read-only one serves both.
func TestLocalPeerUID(t *testing.T) {
	if addr := os.Getenv("FSRV_TEST_DIAL"); addr != "" {
		dialAsPeer(t, addr)
		return
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	f := newFixture()
	srv := f.server(t)
	rwL, err := Listen("tcp!127.0.0.1!0")
	if err != nil {
		t.Fatal(err)
	}
	roL, err := Listen("tcp!127.0.0.1!0,ro")
	if err != nil {
		t.Fatal(err)
	}
	rw, ro := serveOn(t, srv, rwL), serveOn(t, srv, roL)

	if got := runPeerAs(t, 65534, rw); !strings.Contains(got, "permission denied") {
		t.Errorf("uid 65534 on the read-write %s: %q; want permission denied", rw, got)
	}
	if got := runPeerAs(t, 65534, ro); got != "READY" {
		t.Errorf("uid 65534 on the read-only %s: %q; want READY", ro, got)
	}
	if got := runPeerAs(t, os.Getuid(), rw); got != "READY" {
		t.Errorf("uid %d (the server's) on the read-write %s: %q; want READY", os.Getuid(), rw, got)
	}
}

// The owner of a client's socket is found by the connection's addresses
// while a process holds it; once the client closed it, it is not taken
// for root (the kernel reports 0 as a closed socket's owner).
func TestSocketOwner(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	local, remote := s.LocalAddr().(*net.TCPAddr).AddrPort(), s.RemoteAddr().(*net.TCPAddr).AddrPort()
	if uid, err := socketOwner(remote, local); err != nil || int(uid) != os.Getuid() {
		t.Errorf("socketOwner(the client's socket) = %d, %v; want %d", uid, err, os.Getuid())
	}
	if got, want := identity(s), "uid="+strconv.Itoa(os.Getuid()); got != want {
		t.Errorf("identity(a loopback TCP connection) = %q; want %q, for the audit line", got, want)
	}
	c.Close()
	if uid, err := socketOwner(remote, local); !errors.Is(err, errNoPeer) {
		t.Errorf("socketOwner(a closed client socket) = %d, %v; want errNoPeer", uid, err)
	}
	if uid, err := socketOwner(netip.MustParseAddrPort("127.0.0.1:1"), local); !errors.Is(err, errNoPeer) {
		t.Errorf("socketOwner(no socket) = %d, %v; want errNoPeer", uid, err)
	}
}
