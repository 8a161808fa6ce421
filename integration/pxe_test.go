package integration

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/enroll"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// The gateway simulator's address inside the guest: QEMU's guestfwd
// relays it to the simulator on the host. It exists only inside QEMU.
const simGuestAddr = "10.0.2.100"

// pxeBootsEnv asks TestPXEBoot for several boots, to report the median
// boot time (one boot otherwise, to keep CI short).
const pxeBootsEnv = "SHARDFS_PXE_BOOTS"

// The enrollment server's address inside the guest: QEMU's guestfwd
// relays it to netboot --serve on the host.
const enrollGuestAddr = "10.0.2.101"

// TestPXEBoot boots a node the way a bare-metal one boots: the real iPXE
// ROM gets DHCP and boot.ipxe from QEMU's user-mode network (restricted to
// the forwards), loads netboot's kernel and initrd over TFTP, and shardfs
// runs as /init: it brings the network up by DHCP, makes a key, and asks
// the enrollment server (shardfs netboot --serve on the host, through
// guestfwd) for its secrets. Nothing the boot server serves holds a
// secret. The test approves the node's fingerprint on the server's tree,
// while a request from another key waits, gets nothing, and is denied;
// the node then reaches the gateway simulator on the host over wss://
// through guestfwd and serves the tree on port 5641, forwarded to the
// host, every shard READY. The time from the approval to the tree served
// is logged. The same image boots once more, and a one-time code typed on
// its console enrolls it without approval; the code used again is
// refused.
func TestPXEBoot(t *testing.T) {
	k := kit(t)
	if _, err := os.Stat(IPXEROM); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %s (Debian package ipxe-qemu): %v", IPXEROM, err)
		}
		t.Skipf("%s (Debian package ipxe-qemu): %v", IPXEROM, err)
	}
	dir := t.TempDir()
	shardfs := buildStatic(t, dir)

	// One CA signs the simulator's certificate (for its address in the
	// guest) and the operator's client certificate, and is the node CA
	// that signs the nodes' listener certificates. The enrollment CA is
	// apart: the image carries it, and it signs the enrollment server's
	// certificate alone.
	ca, err := certs.NewCA("shardfs PXE test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(filepath.Join(dir, "ca"), ca.Cert, ca.Key); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	enrollCA, err := certs.NewCA("shardfs PXE test enrollment CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	enrollCAFile := filepath.Join(dir, "enroll-ca.crt")
	if err := os.WriteFile(enrollCAFile, certs.CertPEM(enrollCA.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	issue(t, enrollCA, certs.Server, "enroll", []string{enrollGuestAddr, "127.0.0.1"}, filepath.Join(dir, "enroll"))
	simCert := issue(t, ca, certs.Server, "gateway", []string{simGuestAddr}, "")
	issue(t, ca, certs.Client, "operator", nil, filepath.Join(dir, "operator"))
	const token = "pxe-test-token"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The one-time code of the second boot, for QEMU's first NIC.
	const code = "PXE1-TEST-CODE-0001"
	codeFile := filepath.Join(dir, "codes")
	if err := os.WriteFile(codeFile, []byte("52:54:00:12:34:56 "+code+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sim, err := gatewaysim.New(gatewaysim.Config{
		Flavor: gatewaysim.Discord, Shards: 2, Token: token,
		TLS:    &tls.Config{Certificates: []tls.Certificate{simCert.TLS()}},
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	// READY's resume_gateway_url must be reachable from the guest too.
	sim.SetResumeURL("wss://" + simGuestAddr + "/")

	es := startEnrollServer(t, shardfs, dir, tokenFile, codeFile)

	out := filepath.Join(dir, "tftp")
	// No shardfs.listen: with the TLS files enrollment brings, the node
	// listens on tls!0.0.0.0!5641.
	cmdline := "console=ttyS0 panic=-1 quiet no_timer_check shardfs.flavor=discord shardfs.total=2 shardfs.gateway=wss://" + simGuestAddr + "/ shardfs.enroll=" + enrollGuestAddr + ":5650"
	nb := exec.Command(shardfs, "netboot", "--out", out, "--kernel", kernelDir(k),
		"--modules", "virtio_pci,virtio_net", "--ca-bundle", caFile, "--enroll-ca", enrollCAFile, "--cmdline", cmdline)
	if b, err := nb.CombinedOutput(); err != nil {
		t.Fatalf("shardfs netboot: %v\n%s", err, b)
	} else {
		t.Logf("shardfs netboot:\n%s", b)
	}
	// Nothing the boot server serves holds a secret: not the token, not
	// the code, not a private key (the CAs', the enrollment server's, the
	// operator's). The archives are looked at decompressed.
	var keys []string
	for _, f := range []string{"ca.key", "enroll.key", "operator.key"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, strings.TrimSpace(string(b)))
	}
	served, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range served {
		names = append(names, e.Name())
		b := readMaybeGzip(t, filepath.Join(out, e.Name()))
		if strings.Contains(b, token) || strings.Contains(b, code) || pemKey.MatchString(b) {
			t.Errorf("%s holds the token, the code or a PEM private key", e.Name())
		}
		for _, key := range keys {
			if strings.Contains(b, key) {
				t.Errorf("%s holds a private key", e.Name())
			}
		}
	}
	if got := strings.Join(names, " "); got != "boot.ipxe initrd.cpio.gz vmlinuz" {
		t.Errorf("the boot server serves %s; want boot.ipxe initrd.cpio.gz vmlinuz", got)
	}

	boots := 1
	if n, err := strconv.Atoi(os.Getenv(pxeBootsEnv)); err == nil && n > 1 {
		boots = n
	}
	var toServed, toApproved []time.Duration
	for i := range boots {
		b, a := pxeBoot(t, k, shardfs, dir, out, sim, es, i == 0)
		if t.Failed() {
			return
		}
		toServed, toApproved = append(toServed, b), append(toApproved, a)
	}
	slices.Sort(toServed)
	slices.Sort(toApproved)
	t.Logf("boot -> tree served over 9P: median %v of %d boots %v", toServed[len(toServed)/2].Round(100*time.Millisecond), boots, toServed)
	t.Logf("approval -> tree served over 9P: median %v of %d boots %v", toApproved[len(toApproved)/2].Round(100*time.Millisecond), boots, toApproved)

	pxeBootCode(t, k, shardfs, dir, out, sim, es, code)
}

// pemKey matches a PEM private key block with its content (the binary
// holds the words of the armour, as constants of crypto/x509).
var pemKey = regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/]{16}`)

// enrollServer is shardfs netboot --serve running on the host.
type enrollServer struct {
	addr string // host:port on the host
	port int
	cli  func(args ...string) (string, error) // the built-in client on its tree
	pool *x509.CertPool
}

// startEnrollServer runs shardfs netboot --serve until the test ends.
func startEnrollServer(t *testing.T, shardfs, dir, tokenFile, codeFile string) *enrollServer {
	t.Helper()
	port := freePort(t)
	sock := filepath.Join(dir, "enroll.sock")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, shardfs, "netboot", "--serve", fmt.Sprintf("127.0.0.1:%d", port),
		"--enroll-cert", filepath.Join(dir, "enroll.crt"), "--enroll-key", filepath.Join(dir, "enroll.key"),
		"--node-ca", filepath.Join(dir, "ca"), "--tls-client-ca", filepath.Join(dir, "ca.crt"),
		"--token-file", tokenFile, "--enroll-code", codeFile, "--listen", "unix!"+sock)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		text := log.String()
		t.Logf("shardfs netboot --serve:\n%s", text)
		if strings.Contains(text, "PXE1-TEST-CODE") || strings.Contains(text, "pxe-test-token") {
			t.Error("netboot --serve logged the code or the token")
		}
	})
	es := &enrollServer{addr: fmt.Sprintf("127.0.0.1:%d", port), port: port}
	es.cli = func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := exec.CommandContext(cctx, shardfs, append([]string{args[0], "--addr", "unix!" + sock}, args[1:]...)...).CombinedOutput()
		return string(b), err
	}
	// A separate process: poll its tree, with a bound on a hang.
	if err := poll.Until(t.Context(), "netboot --serve's tree", time.Minute, 100*time.Millisecond, func() error {
		_, err := es.cli("cat", "enroll/pending")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "enroll-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	es.pool = x509.NewCertPool()
	es.pool.AppendCertsFromPEM(b)
	return es
}

// syncBuffer is a bytes.Buffer that a process's output and the test may
// use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// hostClient is an enrollment request from the host, with a key of its
// own, as an intruder on the boot network would send it.
func (es *enrollServer) hostClient(t *testing.T, mac string) *enroll.Client {
	key, err := enroll.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return &enroll.Client{Addr: es.addr, CA: es.pool, Key: key, Name: "intruder", MAC: mac}
}

// fingerprintOnConsole waits for the node's fingerprint on its console.
func fingerprintOnConsole(t *testing.T, ctx context.Context, m *Machine) string {
	t.Helper()
	const marker = "enrollment: this node's key is "
	text, err := m.Console.Expect(ctx, "or type this node's one-time code here and press Enter")
	if err != nil {
		t.Fatalf("console: %v", err)
	}
	i := strings.LastIndex(text, marker)
	if i < 0 {
		t.Fatalf("console before the approval hint:\n%s\nwant %q", text, marker)
	}
	fp := strings.Fields(text[i+len(marker):])[0]
	if !enroll.ValidFingerprint(fp) {
		t.Fatalf("fingerprint on the console %q is not one", fp)
	}
	return fp
}

// pxeBootCode boots the image again: the operator types the node's
// one-time code on its console, the node enrolls without approval, and
// its tree is served; the same code from another key is refused.
func pxeBootCode(t *testing.T, k Kit, shardfs, dir, tftp string, sim *gatewaysim.Server, es *enrollServer, code string) {
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, stop := bootMachine(t, ctx, pxeConfig(k, tftp, port, sim, es))
	defer stop()
	fp := fingerprintOnConsole(t, ctx, m)
	if _, err := m.Console.Expect(ctx, "waits for approval"); err != nil {
		t.Fatalf("console: %v", err)
	}
	if err := m.Type(code + "\n"); err != nil {
		t.Fatal(err)
	}
	for _, marker := range []string{"enrollment: sending the code typed on the console", "enrolled (code)", "access=read-write"} {
		if _, err := m.Console.Expect(ctx, marker); err != nil {
			t.Fatalf("console: %v", err)
		}
		t.Logf("%6.1fs  %s", time.Since(m.Started).Seconds(), marker)
	}
	if strings.Contains(m.Console.String(), code) {
		t.Error("the code typed on the console shows on it")
	}
	cli := nodeCLI(ctx, shardfs, dir, port)
	var status string
	if err := poll.Until(ctx, "shardfs cat enroll/status through the forward", 2*time.Minute, 200*time.Millisecond, func() error {
		var err error
		if status, err = cli("cat", "enroll/status"); err != nil {
			return fmt.Errorf("%w: %s", err, status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status, "fingerprint "+fp+"\n") || !strings.Contains(status, "by code\n") {
		t.Errorf("enroll/status =\n%s\nwant fingerprint %s, by code", status, fp)
	}
	if enrolled, err := es.cli("cat", "enroll/enrolled"); err != nil || !strings.Contains(enrolled, fp+" ") || !strings.Contains(enrolled, " code ") {
		t.Errorf("the server's enroll/enrolled = %q, %v; want %s by code", enrolled, err, fp)
	}
	// The code once more, from another key with the node's MAC: refused.
	intruder := es.hostClient(t, "52:54:00:12:34:56")
	if sec, err := intruder.Enroll(ctx, code, nil); !errors.Is(err, enroll.ErrRefused) || sec != nil {
		t.Errorf("a reused code: Enroll = %+v, %v; want refused, nothing", sec, err)
	} else {
		t.Logf("a reused code: %v", err)
	}
}

// pxeConfig is a PXE boot with the forwards: the node's TLS listener to
// port on the host, the simulator and the enrollment server into the
// guest.
func pxeConfig(k Kit, tftp string, port int, sim *gatewaysim.Server, es *enrollServer) Config {
	simPort := sim.Addr()[strings.LastIndex(sim.Addr(), ":")+1:]
	return Config{QEMU: k.QEMU, MemoryMiB: 512, PXE: &PXE{
		TFTP: tftp, BootFile: "boot.ipxe",
		HostFwd: []string{fmt.Sprintf("tcp:127.0.0.1:%d-:5641", port)},
		GuestFwd: []string{
			fmt.Sprintf("tcp:%s:443-cmd:%s nc 127.0.0.1 %s", simGuestAddr, k.Busybox, simPort),
			fmt.Sprintf("tcp:%s:5650-cmd:%s nc 127.0.0.1 %d", enrollGuestAddr, k.Busybox, es.port),
		},
	}}
}

// nodeCLI is the built-in client on the node's tree, over TLS through the
// forward.
func nodeCLI(ctx context.Context, shardfs, dir string, port int) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		b, err := exec.CommandContext(cctx, shardfs, append(append([]string{args[0]}, nodeTLSArgs(dir, port)...), args[1:]...)...).CombinedOutput()
		return string(b), err
	}
}

func nodeTLSArgs(dir string, port int) []string {
	return []string{"--addr", fmt.Sprintf("tls!127.0.0.1!%d", port), "--cert", filepath.Join(dir, "operator.crt"), "--key", filepath.Join(dir, "operator.key"), "--ca", filepath.Join(dir, "ca.crt")}
}

// readMaybeGzip is a file's content, decompressed when it is gzip.
func readMaybeGzip(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(b)); err == nil {
		if b, err = io.ReadAll(zr); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return string(b)
}

// pxeBoot boots the guest once, approves its enrollment (while another
// key's request waits and is denied) and returns the times from QEMU's
// start and from the approval to the first status read through the
// forwarded port. With drive, it also waits for every shard READY, resets
// shard 0 and follows its events.
func pxeBoot(t *testing.T, k Kit, shardfs, dir, tftp string, sim *gatewaysim.Server, es *enrollServer, drive bool) (fromBoot, fromApproval time.Duration) {
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, stop := bootMachine(t, ctx, pxeConfig(k, tftp, port, sim, es))
	defer stop()
	cli := nodeCLI(ctx, shardfs, dir, port)
	tlsArgs := nodeTLSArgs(dir, port)

	// Markers end their lines (see Console.Expect): iPXE has its script
	// (the kernel's and the initrd's lines may carry a progress
	// percentage), the kernel runs /init (quiet: /init's first line), DHCP
	// is done, the node waits.
	for _, marker := range []string{"Filename: boot.ipxe", "shardfs-init: setting up the root file system:", "DHCP Lease IP 10.0.2.15/24"} {
		if _, err := m.Console.Expect(ctx, marker); err != nil {
			t.Fatalf("console: %v", err)
		}
		t.Logf("%6.1fs  %s", time.Since(m.Started).Seconds(), marker)
	}
	fp := fingerprintOnConsole(t, ctx, m)
	if _, err := m.Console.Expect(ctx, "waits for approval"); err != nil {
		t.Fatalf("console: %v", err)
	}
	t.Logf("%6.1fs  the node waits for approval: %s", time.Since(m.Started).Seconds(), fp)

	// Another key asks too, with the node's MAC: it waits beside the
	// node, and the node's approval gives it nothing.
	var other struct {
		sec *enroll.Secrets
		err error
	}
	intruder := es.hostClient(t, "52:54:00:12:34:56")
	otherPending, otherDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(otherDone)
		other.sec, other.err = intruder.Enroll(ctx, "", func() { close(otherPending) })
	}()
	select {
	case <-otherPending:
	case <-otherDone:
		t.Fatalf("another key's request: %+v, %v; want it pending", other.sec, other.err)
	}
	pending, err := es.cli("cat", "enroll/pending")
	if err != nil || !strings.Contains(pending, fp+" 52:54:00:12:34:56 127.0.0.1 ") || !strings.Contains(pending, intruder.Fingerprint()+" ") {
		t.Fatalf("enroll/pending = %q, %v; want the node's line (fingerprint mac addr since) and the other key's", pending, err)
	}
	t.Logf("enroll/pending:\n%s", pending)
	if b, err := es.cli("write", "enroll/ctl", "approve "+fp); err != nil {
		t.Fatalf("approve: %v\n%s", err, b)
	}
	approved := time.Now()

	// The forward accepts (and drops) connections before the guest
	// listens: poll, with a bound on a hang only. The guest runs under
	// TCG: on a loaded machine its TLS handshake alone took tens of
	// seconds (a 176 s boot missed a 30 s bound here).
	var status string
	err = poll.Until(ctx, "shardfs cat status through the forward", 2*time.Minute, 200*time.Millisecond, func() error {
		var err error
		if status, err = cli("cat", "status"); err != nil {
			return fmt.Errorf("%w: %s", err, status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fromBoot, fromApproval = time.Since(m.Started), time.Since(approved)
	t.Logf("%6.1fs  tree served over TLS, %.1fs after the approval: status\n%s", fromBoot.Seconds(), fromApproval.Seconds(), status)

	select {
	case <-otherDone:
		t.Errorf("another key's request ended at the node's approval: %+v, %v; want it waiting", other.sec, other.err)
	default:
	}
	if b, err := es.cli("write", "enroll/ctl", "deny "+intruder.Fingerprint()); err != nil {
		t.Fatalf("deny: %v\n%s", err, b)
	}
	<-otherDone
	if !errors.Is(other.err, enroll.ErrRefused) || other.sec != nil {
		t.Errorf("the denied key: %+v, %v; want refused, nothing", other.sec, other.err)
	}
	if st, err := cli("cat", "enroll/status"); err != nil || !strings.Contains(st, "fingerprint "+fp+"\n") || !strings.Contains(st, "by approved\n") {
		t.Errorf("the node's enroll/status = %q, %v; want its fingerprint, approved", st, err)
	}
	if !drive {
		return fromBoot, fromApproval
	}

	// A plain 9P client on the TLS port is refused.
	plain, err := exec.CommandContext(ctx, shardfs, "cat", "--addr", fmt.Sprintf("tcp!127.0.0.1!%d", port), "status").CombinedOutput()
	if err == nil {
		t.Errorf("plain 9P on the TLS port: read status\n%s\nwant a refusal", plain)
	} else {
		t.Logf("plain 9P on the TLS port: refused: %s", strings.TrimSpace(string(plain)))
	}

	// Both shards get READY over wss:// through guestfwd.
	var fields []string
	waitStatus(t, cli, func(lines [][]string) bool {
		fields = nil
		for _, f := range lines {
			if f[1] != "READY" {
				return false
			}
			if f[0] == "0" {
				fields = f
			}
		}
		return len(lines) == 2 && fields != nil
	})
	reconnects, _ := strconv.Atoi(fields[3])
	resumes := sim.Stats(0).Resumes

	// Follow shard 0's events while it is reset.
	tctx, stopTail := context.WithCancel(ctx)
	tail := exec.CommandContext(tctx, shardfs, append(append([]string{"tail"}, tlsArgs...), "-n", "1", "0/events")...)
	tailOut, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(tailOut)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	defer func() {
		stopTail()
		for range lines {
		}
		tail.Wait()
	}()

	// The last line shows once tail follows: only then is the reset's
	// line certain to come after where it started.
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("shardfs tail 0/events ended")
		}
		t.Logf("tail 0/events (the last line): %s", l)
	case <-time.After(30 * time.Second):
		t.Fatal("shardfs tail -n 1 0/events printed nothing within 30 s")
	}
	if out, err := cli("write", "0/ctl", "reset"); err != nil {
		t.Fatalf("shardfs write 0/ctl reset: %v\n%s", err, out)
	}
	waitStatus(t, cli, func(lines [][]string) bool {
		for _, f := range lines {
			if n, _ := strconv.Atoi(f[3]); f[0] == "0" && f[1] == "READY" && n == reconnects+1 {
				return true
			}
		}
		return false
	})
	if got := sim.Stats(0).Resumes; got != resumes+1 {
		t.Errorf("simulator: shard 0 resumes = %d; want %d (a reset resumes)", got, resumes+1)
	}
	timeout := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("shardfs tail 0/events ended")
			}
			t.Logf("tail 0/events: %s", l)
			seen = strings.Contains(l, "operator reset")
		case <-timeout:
			t.Fatal("shardfs tail 0/events: no line with \"operator reset\" within 30 s")
		}
	}
	plan, err := cli("cat", "plan")
	if err != nil || strings.Contains(plan, "pxe-test-token") {
		t.Errorf("cat plan: %v, holds the token: %v", err, strings.Contains(plan, "pxe-test-token"))
	}
	return fromBoot, fromApproval
}

// waitStatus polls the node's status until ok holds, for at most 60 s
// (the guest is a separate machine: polling with a bound).
func waitStatus(t *testing.T, cli func(...string) (string, error), ok func(lines [][]string) bool) {
	t.Helper()
	err := poll.Until(t.Context(), "status in the expected state", 60*time.Second, 250*time.Millisecond, func() error {
		out, err := cli("cat", "status")
		if err != nil {
			return err
		}
		var lines [][]string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) >= 4 {
				lines = append(lines, f)
			}
		}
		if !ok(lines) {
			return fmt.Errorf("status:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// buildStatic builds shardfs as netboot needs it: static, stripped.
func buildStatic(t *testing.T, dir string) string {
	bin := filepath.Join(dir, "shardfs")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/shardfs/shardfs/cmd/shardfs")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built a static shardfs (%d bytes) in %v", fi.Size(), time.Since(start).Round(100*time.Millisecond))
	return bin
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// kernelDir is the unpacked kernel package the kit found.
func kernelDir(k Kit) string { return filepath.Dir(filepath.Dir(k.Kernel)) }

// issue makes a certificate signed by ca and, when base is set, writes
// base.crt and base.key.
func issue(t *testing.T, ca *certs.CA, kind certs.Kind, name string, names []string, base string) *certs.Issued {
	t.Helper()
	c, err := ca.Issue(kind, name, names, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if base != "" {
		if err := certs.WriteFiles(base, c.Cert, c.Key); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestBareMetalBadInput boots netboot's image (directly, with -kernel)
// on a NIC whose network has no DHCP server, and a command line with a
// misspelt key: the console names the key and goes on, and shows DHCP
// failing and being retried with a backoff. The command line is given to
// QEMU (-append), as boot.ipxe would give it.
func TestBareMetalBadInput(t *testing.T) {
	k := kit(t)
	dir := t.TempDir()
	shardfs := buildStatic(t, dir)
	out := filepath.Join(dir, "out")
	nb := exec.Command(shardfs, "netboot", "--out", out, "--kernel", kernelDir(k), "--modules", "virtio_pci,virtio_net",
		"--ca-bundle", "", "--cmdline", "console=ttyS0 shardfs.flavor=discord shardfs.total=2 shardfs.totl=3 shardfs.listen=tcp!0.0.0.0!5641,insecure")
	if b, err := nb.CombinedOutput(); err != nil {
		t.Fatalf("shardfs netboot: %v\n%s", err, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, stop := bootMachine(t, ctx, Config{
		QEMU: k.QEMU, Kernel: kernelImage(t, k), Initrd: filepath.Join(out, "initrd.cpio.gz"), MemoryMiB: 512,
		Append: "shardfs.flavor=discord shardfs.total=2 shardfs.totl=3 shardfs.listen=tcp!0.0.0.0!5641,insecure",
		// A NIC on a UDP socket nobody reads: no DHCP server answers.
		// -cpu max: RDRAND, so that the kernel's RNG is ready at boot.
		NIC: []string{"-cpu", "max", "-netdev", fmt.Sprintf("socket,id=n0,udp=127.0.0.1:%d,localaddr=127.0.0.1:0", freePort(t)), "-device", "virtio-net-pci,netdev=n0"},
	})
	defer stop()
	for _, marker := range []string{
		"shardfs.totl: unknown key (known: shardfs.flavor, shardfs.total, shardfs.shards, shardfs.listen, shardfs.etcd, shardfs.bot, shardfs.node, shardfs.api, shardfs.gateway, shardfs.enroll) (ignored)",
		"module virtio_net loaded",
		"; retrying in 1s", // the doubling is TestRetryBackoff's (baremetal), to keep CI short
	} {
		text, err := m.Console.Expect(ctx, marker)
		if err != nil {
			t.Fatalf("console: %v", err)
		}
		if strings.HasPrefix(marker, "; retrying") && !strings.Contains(text, "shardfs-init: DHCP failed: no DHCP answer on any interface") {
			t.Errorf("console before %q:\n%s\nwant the DHCP failure named", marker, text)
		}
		t.Logf("%6.1fs  %s", time.Since(m.Started).Seconds(), marker)
	}
}

// bootMachine boots cfg; a failure to start fails the test. stop kills the
// guest, waits for it and, when the test failed, logs its console.
func bootMachine(t *testing.T, ctx context.Context, cfg Config) (m *Machine, stop func()) {
	t.Helper()
	m, err := Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, func() {
		m.Kill()
		m.Wait()
		if t.Failed() {
			t.Logf("console:\n%s", m.Console)
		}
	}
}
