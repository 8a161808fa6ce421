package client

import (
	"bytes"
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
	"time"

	"github.com/hugelgupf/p9/linux"
	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv("SHARDFS_TEST_PEER_SERVE"); sock != "" {
		servePeer(sock) // TestPeerOtherUID's server, as another user
		return
	}
	if os.Getenv("SHARDFS_TEST_PEER_SERVE_TCP") != "" {
		servePeerTCP() // TestLoopbackPeerOtherUID's
		return
	}
	goleak.VerifyTestMain(m)
}

// testNode is a one-shard demo node served on a unix socket in a
// temporary folder, and on tls!127.0.0.1!PORT when a PKI is given.
type testNode struct {
	*demo.Demo
	addr    string // unix!PATH
	tlsAddr string
}

func startNode(t *testing.T, pki string) *testNode {
	t.Helper()
	d, err := demo.Start(context.Background(), demo.Config{Shards: 1, Traffic: -1})
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{Demo: d, addr: "unix!" + filepath.Join(t.TempDir(), "node.sock")}
	l, err := fsrv.Listen(n.addr)
	if err != nil {
		t.Fatal(err)
	}
	ls := []net.Listener{l}
	if pki != "" {
		conf, err := fsrv.ServerTLSConfig(filepath.Join(pki, "server.crt"), filepath.Join(pki, "server.key"), filepath.Join(pki, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		tl, err := fsrv.ListenTLS("tls!127.0.0.1!0", conf)
		if err != nil {
			t.Fatal(err)
		}
		n.tlsAddr = "tls!127.0.0.1!" + strings.TrimPrefix(tl.Addr().String(), "127.0.0.1:")
		ls = append(ls, tl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ls...) }()
	t.Cleanup(func() {
		cancel()
		<-served
		d.Close()
	})
	return n
}

// waitReady waits, at most 30 s, for shard 0 to be READY, looking again
// at every lifecycle event.
func (n *testNode) waitReady(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Wait(ctx, func() bool {
		d, _ := n.Node.Scheduler.Diag(0)
		return d.State == core.Ready
	}); err != nil {
		t.Fatalf("shard 0 never READY: %v", err)
	}
}

func dial(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(context.Background(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate into a temporary folder.
func testPKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := certs.NewCA("test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	for name, kind := range map[string]certs.Kind{"server": certs.Server, "client": certs.Client} {
		i, err := ca.Issue(kind, name, []string{"127.0.0.1"}, certs.Validity{})
		if err != nil {
			t.Fatal(err)
		}
		if err := certs.WriteFiles(filepath.Join(dir, name), i.Cert, i.Key); err != nil {
			t.Fatal(err)
		}
	}
	if err := certs.WriteFiles(filepath.Join(dir, "ca"), ca.Cert, ca.Key); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Read, list, stat and write: a reset written to ctl counts as a
// reconnect.
func TestReadWrite(t *testing.T) {
	n := startNode(t, "")
	n.waitReady(t)
	c := dial(t, n.addr)
	if c.Addr() != n.addr {
		t.Errorf("Addr() = %q; want %q", c.Addr(), n.addr)
	}
	if b, err := c.ReadFile("0/state"); err != nil || string(b) != "READY\n" {
		t.Errorf("ReadFile(0/state) = %q, %v; want READY", b, err)
	}
	ents, err := c.List("/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Name == "0" && !e.Dir || e.Name == "status" && e.Dir {
			t.Errorf("List(/) entry %+v: wrong Dir", e)
		}
		names = append(names, e.Name)
	}
	for _, want := range []string{"0", "status", "ctl", "events"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("List(/) = %q; want %q among them", names, want)
		}
	}
	for _, tc := range []struct {
		path string
		dir  bool
		name string
	}{{"/", true, ""}, {"0", true, "0"}, {"0/state", false, "state"}, {"0/ctl/", false, "ctl"}} {
		fi, err := c.Stat(tc.path)
		if err != nil || fi.IsDir() != tc.dir || fi.Mode().IsDir() != tc.dir || tc.name != "" && fi.Name() != tc.name {
			t.Errorf("Stat(%q) = %v, %v; want IsDir %t, name %q", tc.path, fi, err, tc.dir, tc.name)
		}
	}
	if _, err := c.Stat("0/nothing"); !errors.Is(err, linux.ENOENT) {
		t.Errorf("Stat(0/nothing) = %v; want ENOENT", err)
	}
	if _, err := c.List("0/state"); err == nil {
		t.Errorf("List(0/state) of a file succeeded")
	}
	if err := c.WriteFile("0/ctl", []byte("reset\n")); err != nil {
		t.Fatalf("WriteFile(0/ctl, reset) = %v", err)
	}
	if b, err := c.ReadFile("0/reconnects"); err != nil || string(b) != "1\n" {
		t.Errorf("0/reconnects after a reset = %q, %v; want 1", b, err)
	}
}

// A refused ctl command comes back with the node's reason, with or
// without its newline (then it is applied at clunk).
func TestWriteRefused(t *testing.T) {
	n := startNode(t, "")
	c := dial(t, n.addr)
	for _, cmd := range []string{"frobnicate\n", "frobnicate"} {
		err := c.WriteFile("0/ctl", []byte(cmd))
		var r *RefusedError
		if !errors.As(err, &r) || !errors.Is(err, linux.EINVAL) || !strings.Contains(r.Reason, `event=rejected cmd=? len=10 err="unknown command; usage: `) {
			t.Errorf("WriteFile(0/ctl, %q) = %v; want a *RefusedError with EINVAL and the events line", cmd, err)
		}
		if err != nil && !strings.HasSuffix(err.Error(), "\n"+r.Reason) {
			t.Errorf("WriteFile(0/ctl, %q).Error() = %q; want the reason on a line of its own", cmd, err)
		}
	}
	// Not a ctl file: no reason is looked for.
	var r *RefusedError
	if err := c.WriteFile("0/state", []byte("READY\n")); err == nil || errors.As(err, &r) {
		t.Errorf("WriteFile(0/state) = %v; want a plain error", err)
	}
}

// Without an address, Dial tries each default in turn; when none
// answers its error names every address with its own error.
func TestDialNamesEveryAddress(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr)
	l.Close()
	addrs := []string{"unix!" + sock, closed.String()}
	_, err = dialer{}.dialFirst(context.Background(), addrs)
	var de *DialError
	if !errors.As(err, &de) || len(de.Errs) != 2 {
		t.Fatalf("dialFirst(%q) = %v; want a *DialError for both", addrs, err)
	}
	for _, want := range []string{"\n\tunix!" + sock + ": dial unix " + sock + ": ", "\n\t" + closed.String() + ": dial tcp " + closed.String() + ": "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("dialFirst(%q) = %q; want a line starting %q", addrs, err, want)
		}
	}
	if !errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dialFirst(%q) = %v; want it to wrap ENOENT and ECONNREFUSED", addrs, err)
	}

	// The first that answers wins, after those that did not.
	n := startNode(t, "")
	c, err := dialer{}.dialFirst(context.Background(), []string{"unix!" + sock, n.addr})
	if err != nil {
		t.Fatalf("dialFirst(dead, live) = %v", err)
	}
	defer c.Close()
	if c.Addr() != n.addr {
		t.Errorf("dialFirst(dead, live) reached %q; want %q", c.Addr(), n.addr)
	}

	if got := DefaultAddrs(); len(got) != 2 || got[0] != "unix!"+fsrv.DefaultSocket() || got[1] != fsrv.DefaultAddr {
		t.Errorf("DefaultAddrs() = %q; want the unix socket, then %s", got, fsrv.DefaultAddr)
	}
}

// lineWriter passes each write on to a channel, so that a test waits
// for output instead of sleeping.
type lineWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	select {
	case w.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// Tail prints the last lines of a log, then the lines it gains, until
// its context ends; LastLines prints the last lines alone.
func TestTail(t *testing.T) {
	n := startNode(t, "")
	n.waitReady(t)
	c := dial(t, n.addr)
	c.poll = 10 * time.Millisecond
	all, err := c.ReadFile("0/events")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(all), "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("0/events = %q; want at least two lines", all)
	}
	last2 := strings.Join(lines[len(lines)-2:], "") + "\n"
	if b, err := c.LastLines("0/events", 2); err != nil || string(b) != last2 {
		t.Errorf("LastLines(0/events, 2) = %q, %v; want %q", b, err, last2)
	}
	if b, err := c.LastLines("0/events", 0); err != nil || len(b) != 0 {
		t.Errorf("LastLines(0/events, 0) = %q, %v; want nothing", b, err)
	}

	w := &lineWriter{ch: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	tailed := make(chan error, 1)
	go func() { tailed <- c.Tail(ctx, "0/events", 1, w) }()
	waitOutput(t, w, lines[len(lines)-1])
	if err := c.WriteFile("0/ctl", []byte("frobnicate\n")); err == nil {
		t.Fatal("frobnicate was accepted")
	}
	waitOutput(t, w, `event=rejected cmd=? len=10 err="unknown command; usage: `)
	cancel()
	if err := <-tailed; err != nil {
		t.Errorf("Tail after its context ended = %v; want nil", err)
	}
	if got := w.String(); strings.Count(got, "\n") < 2 || !strings.HasPrefix(got, lines[len(lines)-1]) {
		t.Errorf("Tail printed %q; want the last line, then the new ones", got)
	}
}

// waitOutput waits, at most 30 s, for w to hold want.
func waitOutput(t *testing.T, w *lineWriter, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for !strings.Contains(w.String(), want) {
		select {
		case <-w.ch:
		case <-timeout:
			t.Fatalf("output %q never held %q", w.String(), want)
		}
	}
}

// The client over TLS: WithTLS is used for a tls! address.
func TestDialTLS(t *testing.T) {
	pki := testPKI(t)
	n := startNode(t, pki)
	if _, err := Dial(context.Background(), n.tlsAddr); err == nil || !strings.Contains(err.Error(), "needs the server's CA") {
		t.Errorf("Dial(%s) without WithTLS = %v; want a refusal", n.tlsAddr, err)
	}
	conf, err := fsrv.ClientTLSConfig(filepath.Join(pki, "client.crt"), filepath.Join(pki, "client.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, n.tlsAddr, WithTLS(conf))
	if b, err := c.ReadFile("plan"); err != nil || !strings.Contains(string(b), "flavor discord") {
		t.Errorf("ReadFile(plan) over TLS = %q, %v", b, err)
	}
}

// socketPair is a connected pair of unix sockets, as Mount makes for the
// kernel.
func socketPair(t *testing.T) (kernel, ours net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		if cs[i], err = net.FileConn(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return cs[0], cs[1]
}

// The relay of a trans=fd mount, with a client standing in for the
// kernel on the socket pair: it carries the session over TLS, reports
// the kernel's close as an unmount and the server's as a lost
// connection.
func TestRelay(t *testing.T) {
	pki := testPKI(t)
	n := startNode(t, pki)
	conf, err := fsrv.ClientTLSConfig(filepath.Join(pki, "client.crt"), filepath.Join(pki, "client.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"kernel", "server"} {
		t.Run(who+" closes", func(t *testing.T) {
			server, err := fsrv.Dial(context.Background(), n.tlsAddr, conf)
			if err != nil {
				t.Fatal(err)
			}
			kernel, ours := socketPair(t)
			r := NewRelay(ours, server)
			defer r.Close()
			c, err := New(kernel)
			if err != nil {
				t.Fatalf("9P through the relay: %v", err)
			}
			defer c.Close()
			if plan, err := c.ReadFile("plan"); err != nil || !strings.Contains(string(plan), "flavor discord") {
				t.Errorf("read plan through the relay = %v, %q", err, plan)
			}
			if who == "kernel" {
				c.Close()
			} else {
				server.Close()
			}
			<-r.Done()
			if err := r.Err(); (err == nil) != (who == "kernel") {
				t.Errorf("the %s closed: relay ended with Err() = %v; want nil only when the kernel closes", who, err)
			}
		})
	}
}

// errConn is a connection to a server whose reads fail with err.
type errConn struct {
	net.Conn
	err error
}

func (c errConn) Read([]byte) (int, error) { return 0, c.err }

// A server that refuses the session before the kernel's mount(2) could
// finish explains the failure: its own error, not our close nor its
// hanging up.
func TestRelayRefusal(t *testing.T) {
	refused := errors.New("remote error: tls: bad certificate")
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"refused", refused, refused},
		{"hung up", io.EOF, nil},
		{"closed by us", net.ErrClosed, nil},
	} {
		kernel, ours := socketPair(t)
		a, b := net.Pipe()
		r := NewRelay(ours, errConn{a, tc.err})
		<-r.Done()
		if err := r.Err(); err != tc.err {
			t.Errorf("%s: Err() = %v; want %v", tc.name, err, tc.err)
		}
		if err := r.refusal(); err != tc.want {
			t.Errorf("%s: refusal() = %v; want %v", tc.name, err, tc.want)
		}
		kernel.Close()
		b.Close()
	}
}

// Mount mounts with v9fs where the kernel has it and we may mount;
// elsewhere its error says why and the relay is closed.
func TestMount(t *testing.T) {
	n := startNode(t, "")
	n.waitReady(t)
	fsys, _ := os.ReadFile("/proc/filesystems")
	conn, err := fsrv.Dial(context.Background(), n.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := Mount(context.Background(), conn, MountConfig{Source: n.addr, Dir: dir, ReadOnly: true})
	if os.Getuid() != 0 || !strings.Contains(string(fsys), "\t9p\n") {
		hint := map[bool]string{true: "(mounting needs root or CAP_SYS_ADMIN)", false: "(the kernel has no 9p file system: modprobe 9p)"}[errors.Is(err, syscall.EPERM)]
		if err == nil || !strings.HasPrefix(err.Error(), "mount -t 9p "+n.addr+" "+dir+": ") || !strings.Contains(err.Error(), hint) {
			t.Fatalf("Mount without 9p or root = %v; want mount(2)'s error and %s", err, hint)
		}
		if _, err := conn.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
			t.Errorf("the server connection after a failed Mount: write = %v; want it closed", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Mount = %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "0", "state")); err != nil || string(b) != "READY\n" {
		t.Errorf("0/state through the mount = %q, %v; want READY", b, err)
	}
	if detached, err := m.Unmount(); detached || err != nil {
		t.Errorf("Unmount() = %t, %v; want a plain unmount", detached, err)
	}
	if err := m.Err(); err != nil {
		t.Errorf("Err() after Unmount = %v; want nil", err)
	}
}

// The client is for other programs to import: it must not bring the
// node, the core's runtime or etcd with it.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "etcd") || strings.HasPrefix(dep, "github.com/shardfs/shardfs/") && dep != "github.com/shardfs/shardfs/client" && dep != "github.com/shardfs/shardfs/fsrv" && dep != "github.com/shardfs/shardfs/clock" {
			t.Errorf("client imports %s; want only fsrv (and its clock) of shardfs, and no etcd", dep)
		}
	}
}

// TestWriteCtlWholeLines: a ctl text longer than one message goes in
// writes of whole lines. The 9P library cut it at 65,024 bytes, and the
// node ran the cut line's first part as a command ("lease off" became the
// unknown "leas": attack21b F5). A line longer than MaxCtlLine is refused
// before anything is sent.
func TestWriteCtlWholeLines(t *testing.T) {
	n := startNode(t, "")
	n.waitReady(t)
	c := dial(t, n.addr)
	script := strings.Repeat("lease off\n", 6600) // 66,000 bytes
	if err := c.WriteFile("0/ctl", []byte(script)); err != nil {
		t.Errorf("WriteFile(0/ctl, 6,600 lines of lease off) = %v; want nil", err)
	}
	long := "lease off " + strings.Repeat("x", MaxCtlLine) + "\n"
	err := c.WriteFile("0/ctl", []byte("lease off\n"+long))
	if !errors.Is(err, ErrCtlLineTooLong) || !strings.Contains(err.Error(), "line 2 has 4010 bytes") {
		t.Errorf("WriteFile(0/ctl, a line of %d bytes) = %v; want ErrCtlLineTooLong naming line 2", len(long)-1, err)
	}
}
