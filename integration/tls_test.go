package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/initramfs"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/fsrv"
)

// tlsModules are guestModules with the virtio NIC's (FACTS.md), in load
// order.
var tlsModules = func() []string {
	i := slices.Index(guestModules, "virtio_pci") + 1
	return slices.Concat(guestModules[:i], []string{"failover", "net_failover", "virtio_net"}, guestModules[i:])
}()

// guestAddr is where the guest dials the host's TLS listener: QEMU's
// user network forwards it (guestfwd) to the test process.
const guestAddr = "10.0.2.100"

// TestV9fsTLS: the real kernel over TLS. The guest runs shardfs mount,
// a static build of cmd/shardfs, which authenticates to a tls! listener of
// this process through QEMU's restricted user network and hands v9fs a
// socketpair; the guest reads, resets a shard, has a command refused, runs
// the shell examples on the mount and unmounts, which ends shardfs mount.
// Before that a mount with an expired client certificate fails and says
// so. A read-only mount of one shard (--ro --aname /3) refuses a write
// with EROFS; SIGTERM with a file held open detaches it, the relay serving
// the open file until it is closed. shardfs mount also mounts a plain
// tcp! address.
func TestV9fsTLS(t *testing.T) {
	k := kit(t)
	testStart := time.Now()
	node := startNode(t, shards)

	ca, err := certs.NewCA("integration CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(certs.Server, "host", []string{guestAddr}, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	pki := t.TempDir()
	if err := os.WriteFile(filepath.Join(pki, "ca.crt"), certs.CertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for name, v := range map[string]certs.Validity{
		"client":  {},
		"expired": {NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)},
	} {
		c, err := ca.Issue(certs.Client, "guest-"+name, nil, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := certs.WriteFiles(filepath.Join(pki, name), c.Cert, c.Key); err != nil {
			t.Fatal(err)
		}
	}
	l, err := fsrv.ListenTLS("tls!127.0.0.1!0", &tls.Config{Certificates: []tls.Certificate{server.TLS()}, ClientCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := fsrv.Listen("tcp!127.0.0.1!0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var serving sync.WaitGroup
	serving.Go(func() { node.Server.Serve(ctx, l) })
	serving.Go(func() { node.Server.Serve(ctx, plain) })

	bin := filepath.Join(t.TempDir(), "shardfs")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/shardfs")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build of cmd/shardfs: %v\n%s", err, out)
	}
	kernel := kernelImage(t, k)
	initrd := guestImage(t, k, tlsModules, func(im *initramfs.Image) {
		im.Copy("bin/shardfs", bin, 0o755)
		for _, f := range []string{"ca.crt", "client.crt", "client.key", "expired.crt", "expired.key"} {
			im.Copy("etc/shardfs/"+f, filepath.Join(pki, f), 0o600)
		}
	})
	prepared := time.Since(testStart)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fwd := fmt.Sprintf("guestfwd=tcp:%s:5641-cmd:%s %s %s,guestfwd=tcp:%s:5640-cmd:%s %s %s", guestAddr, self, relayArg, l.Addr(), guestAddr, self, relayArg, plain.Addr())
	m, err := Boot(ctx, Config{
		QEMU: k.QEMU, Kernel: kernel, Initrd: initrd, Ports: []string{"ctl"},
		NIC: []string{"-netdev", "user,id=n0,restrict=on," + fwd, "-device", "virtio-net-pci,netdev=n0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Kill()
		m.Wait()
		cancel()
		serving.Wait()
		if t.Failed() || testing.Verbose() {
			t.Logf("console:\n%s", m.Console)
		}
	})
	g := &guest{m: m, node: node, serve: func(string) {}}
	if _, err := g.expect(ctx, "next"); err != nil {
		t.Fatalf("boot: %v", err)
	}
	timings := []string{fmt.Sprintf("prepare %v", prepared.Round(time.Millisecond)), fmt.Sprintf("boot %v", time.Since(m.Started).Round(time.Millisecond))}
	for _, sc := range tlsScenarios {
		r, err := g.run(ctx, sc)
		if err != nil {
			t.Fatalf("%s: %v (the console follows)", sc.name, err)
		}
		t.Run(sc.name, func(t *testing.T) { sc.check(t, r) })
		timings = append(timings, fmt.Sprintf("%s %v", sc.name, r.took.Round(time.Millisecond)))
		if ms, ok := r.saidAfter("mounted after_ms="); ok {
			timings = append(timings, "shardfs mount "+ms+" ms")
		}
	}
	if err := g.send("poweroff"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the guest did not power off within 30 s")
	}
	if err := m.Wait(); err != nil {
		t.Errorf("QEMU: %v", err)
	}
	timings = append(timings, fmt.Sprintf("total %v", time.Since(testStart).Round(time.Millisecond)))
	t.Logf("timings: %s", strings.Join(timings, ", "))
}

var tlsScenarios = []scenario{
	{
		name: "tlsmount",
		check: func(t *testing.T, r *result) {
			if rc := r.rc["refused"]; rc == 0 || !strings.Contains(strings.Join(r.out["refused"], "\n"), "refused our client certificate: expired") {
				t.Errorf("guest: shardfs mount with an expired certificate: rc %d, %q; want a failure that says expired", rc, r.out["refused"])
			}
			checkListing(t, r, "ls-root", rootModes())
			if got := r.word(t, "state"); got != "READY" {
				t.Errorf("guest: 0/state = %q once every shard was READY", got)
			}
			m := r.word(t, "mounts")
			for _, want := range []string{"tls!10.0.2.100!5641 /mnt/tls 9p ", "nosuid", "nodev", "trans=fd", "access=0"} {
				if !strings.Contains(m, want) {
					t.Errorf("guest: /proc/mounts line %q lacks %q", m, want)
				}
			}
		},
	},
	{
		name: "tlsreset",
		check: func(t *testing.T, r *result) {
			checkReset(t, r, "reset", "reconnects-after")
			if r.rc["frob"] == 0 {
				t.Errorf("guest: writing frobnicate to 0/ctl succeeded; want EINVAL")
			}
			r.ok(t, "events")
		},
	},
	{name: "examples", check: checkExamples},
	{
		name: "tlsro",
		check: func(t *testing.T, r *result) {
			if got := r.word(t, "ro-state"); got != r.before[3].State.String() && got != r.after[3].State.String() {
				t.Errorf("guest: state of /3 mounted alone = %q; the node said %s", got, r.after[3].State)
			}
			if rc, out := r.rc["ro-reset"], strings.Join(r.out["ro-reset"], "\n"); rc == 0 || !strings.Contains(out, "Read-only file system") {
				t.Errorf("guest: reset through a --ro mount: rc %d, %q; want Read-only file system", rc, out)
			}
			if r.after[3].Reconnects != r.before[3].Reconnects {
				t.Errorf("node: shard 3 reconnects %d -> %d after a write through a --ro mount", r.before[3].Reconnects, r.after[3].Reconnects)
			}
			r.ok(t, "mount3-exit")
			if slices.Contains(r.said, "still mounted") {
				t.Errorf("guest: /mnt/tls3 still mounted after SIGTERM to shardfs mount")
			}
			if out := strings.Join(r.out["mount3-out"], "\n"); !strings.Contains(out, "/mnt/tls3 unmounted") || !strings.Contains(out, "/mnt/tls3 is busy: detached") {
				t.Errorf("guest: shardfs mount said %q after SIGTERM with a file open; want it to detach, then report the unmount", out)
			}
			if !slices.Contains(r.said, "relay alive while a file is open") {
				t.Errorf("guest: shardfs mount ended while a file of its detached mount was open")
			}
			if held := r.word(t, "held"); !strings.Contains(held, "shard=") {
				t.Errorf("guest: reading the held-open events file after the detach: %q; want an event line", held)
			}
		},
	},
	{
		name: "plain",
		check: func(t *testing.T, r *result) {
			if got := r.word(t, "plain-state"); got == "" {
				t.Errorf("guest: 0/state through shardfs mount tcp! is empty")
			}
			r.ok(t, "plain-umount", "plain-exit")
		},
	},
	{
		name: "tlsumount",
		check: func(t *testing.T, r *result) {
			r.ok(t, "umount", "mount-exit")
			if out := strings.Join(r.out["mount-out"], "\n"); !strings.Contains(out, "/mnt/tls unmounted") {
				t.Errorf("guest: shardfs mount said %q; want it to report the unmount", out)
			}
		},
	},
}
