package integration

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// The gateway simulator's address inside the guest: QEMU's guestfwd
// relays it to the simulator on the host. It exists only inside QEMU.
const simGuestAddr = "10.0.2.100"

// pxeBootsEnv asks TestPXEBoot for several boots, to report the median
// boot time (one boot otherwise, to keep CI short).
const pxeBootsEnv = "SHARDFS_PXE_BOOTS"

// TestPXEBoot boots a node the way a bare-metal one boots: the real iPXE
// ROM gets DHCP and boot.ipxe from QEMU's user-mode network (restricted to
// the forwards), loads netboot's kernel, initrd and secrets over TFTP,
// and shardfs runs as /init: it brings the network up by DHCP, reaches
// the gateway simulator on the host over wss:// through guestfwd, and
// serves the tree on port 5641, forwarded to the host. The host's
// built-in client reads status, resets shard 0 and follows its events.
// Then the same image boots once more with secrets.cpio.gz removed from
// the TFTP folder: the node serves its tree over TLS, every shard FATAL
// with "no token", and says so on the console.
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
	// guest), the node's (for the forwarded address the host dials) and
	// the operator's client certificate.
	ca, err := certs.NewCA("shardfs PXE test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, certs.CertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	simCert := issue(t, ca, certs.Server, "gateway", []string{simGuestAddr}, "")
	issue(t, ca, certs.Server, "node", []string{"127.0.0.1"}, filepath.Join(dir, "node"))
	issue(t, ca, certs.Client, "operator", nil, filepath.Join(dir, "operator"))
	const token = "pxe-test-token"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
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

	out := filepath.Join(dir, "tftp")
	// No shardfs.listen: with the TLS files the node listens on
	// tls!0.0.0.0!5641.
	cmdline := "console=ttyS0 panic=-1 quiet shardfs.flavor=discord shardfs.total=2 shardfs.gateway=wss://" + simGuestAddr + "/"
	nb := exec.Command(shardfs, "netboot", "--out", out, "--kernel", kernelDir(k),
		"--modules", "virtio_pci,virtio_net", "--ca-bundle", caFile, "--token-file", tokenFile,
		"--tls-cert", filepath.Join(dir, "node.crt"), "--tls-key", filepath.Join(dir, "node.key"), "--tls-client-ca", caFile,
		"--cmdline", cmdline)
	if b, err := nb.CombinedOutput(); err != nil {
		t.Fatalf("shardfs netboot: %v\n%s", err, b)
	} else {
		t.Logf("shardfs netboot:\n%s", b)
	}
	// The image holds no secret: only secrets.cpio.gz carries the token,
	// only tls.cpio.gz the listener's key. The archives are looked at
	// decompressed.
	nodeKey, err := os.ReadFile(filepath.Join(dir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name       string
		token, key bool // which secret it must hold
	}{
		{"boot.ipxe", false, false}, {"initrd.cpio.gz", false, false}, {"vmlinuz", false, false},
		{"tls.cpio.gz", false, true}, {"secrets.cpio.gz", true, false},
	} {
		b := readMaybeGzip(t, filepath.Join(out, f.name))
		if hasToken, hasKey := strings.Contains(b, token), strings.Contains(b, string(nodeKey)); hasToken != f.token || hasKey != f.key {
			t.Errorf("%s: holds the token %v, the TLS key %v; want %v, %v", f.name, hasToken, hasKey, f.token, f.key)
		}
	}
	for _, f := range []string{"secrets.cpio.gz", "tls.cpio.gz"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", f, fi, err)
		}
	}

	boots := 1
	if n, err := strconv.Atoi(os.Getenv(pxeBootsEnv)); err == nil && n > 1 {
		boots = n
	}
	var served []time.Duration
	for i := range boots {
		d := pxeBoot(t, k, shardfs, dir, out, sim, i == 0)
		if t.Failed() {
			return
		}
		served = append(served, d)
	}
	slices.Sort(served)
	t.Logf("boot -> tree served over 9P: median %v of %d boots %v", served[len(served)/2].Round(100*time.Millisecond), boots, served)

	// The same image without secrets.cpio.gz (the file is absent from
	// the TFTP folder): the node serves its tree over the TLS listener
	// tls.cpio.gz brought, every shard FATAL with "no token".
	if err := os.Remove(filepath.Join(out, "secrets.cpio.gz")); err != nil {
		t.Fatal(err)
	}
	pxeBootNoToken(t, k, shardfs, dir, out)
}

// pxeBootNoToken boots an image whose secrets.cpio.gz is absent: the
// console says so (iPXE's echo, then /init's), and the host's client sees
// every shard FATAL with "no token".
func pxeBootNoToken(t *testing.T, k Kit, shardfs, dir, tftp string) {
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, stop := bootMachine(t, ctx, Config{QEMU: k.QEMU, MemoryMiB: 512, PXE: &PXE{
		TFTP: tftp, BootFile: "boot.ipxe", HostFwd: []string{fmt.Sprintf("tcp:127.0.0.1:%d-:5641", port)},
	}})
	defer stop()
	for _, marker := range []string{
		"shardfs: no secrets.cpio.gz: the node boots without its token",
		`shardfs-init: no token: no /secrets/token (secrets.cpio.gz was not loaded, or was made without --token-file); the node serves its tree and every shard is FATAL with "no token"`,
		"listening on tls!0.0.0.0!5641 (the default: tls.cpio.gz brought the TLS files)",
		"access=read-write",
	} {
		if _, err := m.Console.Expect(ctx, marker); err != nil {
			t.Fatalf("console: %v", err)
		}
		t.Logf("%6.1fs  %s", time.Since(m.Started).Seconds(), marker)
	}
	tlsArgs := []string{"--addr", fmt.Sprintf("tls!127.0.0.1!%d", port), "--cert", filepath.Join(dir, "operator.crt"), "--key", filepath.Join(dir, "operator.key"), "--ca", filepath.Join(dir, "ca.pem")}
	cli := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		b, err := exec.CommandContext(cctx, shardfs, append(append([]string{args[0]}, tlsArgs...), args[1:]...)...).CombinedOutput()
		return string(b), err
	}
	waitStatus(t, cli, func(lines [][]string) bool {
		fatal := 0
		for _, f := range lines {
			if f[1] == "FATAL" {
				fatal++
			}
		}
		return len(lines) == 2 && fatal == 2
	})
	for _, shard := range []string{"0", "1"} {
		events, err := cli("cat", shard+"/events")
		if err != nil || !strings.Contains(events, "no token") {
			t.Errorf("cat %s/events = %q, %v; want \"no token\"", shard, events, err)
		}
		t.Logf("without secrets.cpio.gz: shard %s FATAL, events:\n%s", shard, events)
	}
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

// pxeBoot boots the guest once and returns the time from QEMU's start to
// the first status read through the forwarded port. With drive, it also
// resets shard 0 and follows its events.
func pxeBoot(t *testing.T, k Kit, shardfs, dir, tftp string, sim *gatewaysim.Server, drive bool) time.Duration {
	port := freePort(t)
	simPort := sim.Addr()[strings.LastIndex(sim.Addr(), ":")+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, stop := bootMachine(t, ctx, Config{QEMU: k.QEMU, MemoryMiB: 512, PXE: &PXE{
		TFTP: tftp, BootFile: "boot.ipxe",
		HostFwd:  []string{fmt.Sprintf("tcp:127.0.0.1:%d-:5641", port)},
		GuestFwd: []string{fmt.Sprintf("tcp:%s:443-cmd:%s nc 127.0.0.1 %s", simGuestAddr, k.Busybox, simPort)},
	}})
	defer stop()
	addr := fmt.Sprintf("tls!127.0.0.1!%d", port)
	tlsArgs := []string{"--addr", addr, "--cert", filepath.Join(dir, "operator.crt"), "--key", filepath.Join(dir, "operator.key"), "--ca", filepath.Join(dir, "ca.pem")}
	cli := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		args = append(append([]string{args[0]}, tlsArgs...), args[1:]...)
		b, err := exec.CommandContext(cctx, shardfs, args...).CombinedOutput()
		return string(b), err
	}

	// Markers end their lines (see Console.Expect): iPXE has loaded the
	// secrets (after the kernel and the initrd, whose lines may carry a
	// progress percentage), the kernel runs /init (quiet: /init's first line), DHCP is
	// done, the listener is open.
	for _, marker := range []string{"secrets.cpio.gz... ok", "shardfs-init: setting up the root file system:", "DHCP Lease IP 10.0.2.15/24", "access=read-write"} {
		if _, err := m.Console.Expect(ctx, marker); err != nil {
			t.Fatalf("console: %v", err)
		}
		t.Logf("%6.1fs  %s", time.Since(m.Started).Seconds(), marker)
	}
	// The forward accepts (and drops) connections before the guest
	// listens: poll, with a bound on a hang only. The guest runs under
	// TCG: on a loaded machine its TLS handshake alone took tens of
	// seconds (a 176 s boot missed a 30 s bound here).
	var status string
	err := poll.Until(ctx, "shardfs cat status through the forward", 2*time.Minute, 200*time.Millisecond, func() error {
		var err error
		if status, err = cli("cat", "status"); err != nil {
			return fmt.Errorf("%w: %s", err, status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	served := time.Since(m.Started)
	t.Logf("%6.1fs  tree served over TLS: status\n%s", served.Seconds(), status)
	if !drive {
		return served
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
	return served
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
		"shardfs.totl: unknown key (known: shardfs.flavor, shardfs.total, shardfs.shards, shardfs.listen, shardfs.etcd, shardfs.bot, shardfs.node, shardfs.api, shardfs.gateway) (ignored)",
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
