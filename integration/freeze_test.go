package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/initramfs"
	"github.com/shardfs/shardfs/internal/poll"
)

// TestFrozenGuestDelivers measures what a node in a QEMU guest delivers
// after its lease's deadline when the whole VM is frozen past it (issue 22
// item 1): a serve in the guest with `lease 4s` (the operator's lease: the
// same fence as an etcd lease, without a host etcd), frozen for 6 s, first
// with QEMU's monitor (stop/cont: the guest's clocks stand still) and then
// with SIGSTOP of the qemu process (the guest's clocks jump on SIGCONT);
// while frozen the simulator sends 20 events to the shard's session. The
// counts are logged; with SIGSTOP the fence must hold (0 delivered). With
// stop/cont no local clock can see the freeze: the count is the measure
// of that gap (doc/fleet.md), not asserted.
func TestFrozenGuestDelivers(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and freezes it twice for 6 s")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	r := bootFreezeGuest(t, ctx, "", "freeze")
	m, sim, c, mon := r.m, r.sim, r.tree, r.mon

	g := r.g
	qemuPid := m.cmd.Process.Pid
	for i, freeze := range []struct {
		name       string
		stop, cont func() error
		mustHold   bool
	}{
		{"QEMU monitor stop/cont (the guest's clocks stand still)",
			func() error { _, err := fmt.Fprintln(mon, "stop"); return err },
			func() error { _, err := fmt.Fprintln(mon, "cont"); return err }, false},
		{"SIGSTOP/SIGCONT of qemu (the guest's clocks jump)",
			func() error { return syscall.Kill(qemuPid, syscall.SIGSTOP) },
			func() error { return syscall.Kill(qemuPid, syscall.SIGCONT) }, true},
	} {
		// Bring the shard back to READY under a fresh lease.
		if err := c.WriteFile("ctl", []byte("lease off\n")); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			_ = c.WriteFile("ctl", []byte("start all\n")) // refused when lease off already started it
		}
		if err := poll.Until(ctx, "shard 0 READY", 2*time.Minute, 200*time.Millisecond, func() error {
			s, err := c.ReadFile("0/state")
			if err == nil && strings.TrimSpace(string(s)) != "READY" {
				err = fmt.Errorf("0/state %q", s)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile("ctl", []byte("lease 4s\n")); err != nil {
			t.Fatal(err)
		}
		if err := freeze.stop(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(6 * time.Second) // the freeze: a fault, not a wait for a state
		var during []string
		for j := range 20 {
			id := fmt.Sprintf("freeze%d-%d", i, j)
			ev := gatewaysim.Event{Name: "MESSAGE_CREATE", Data: json.RawMessage(`{"id":"` + id + `","content":"x"}`)}
			if _, err := sim.Publish(0, ev); err != nil {
				t.Fatal(err)
			}
			during = append(during, id)
		}
		if err := freeze.cont(); err != nil {
			t.Fatal(err)
		}
		if err := poll.Until(ctx, "shard 0 STOPPED after its lease", 2*time.Minute, 200*time.Millisecond, func() error {
			s, err := c.ReadFile("0/state")
			if err == nil && strings.TrimSpace(string(s)) != "STOPPED" {
				err = fmt.Errorf("0/state %q", s)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		b, err := c.ReadFile("0/dispatch")
		if err != nil {
			t.Fatal(err)
		}
		delivered := 0
		for _, id := range during {
			delivered += strings.Count(string(b), `"id":"`+id+`"`)
		}
		t.Logf("%s: events sent during a 6 s freeze past a 4 s lease, delivered after the thaw: %d of %d", freeze.name, delivered, len(during))
		if freeze.mustHold && delivered != 0 {
			t.Errorf("%s: the guest delivered %d events sent after its deadline; want 0", freeze.name, delivered)
		}
	}
	if err := g.send("go"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.expect(ctx, "end freeze"); err != nil {
		t.Fatal(err)
	}
}

// freezeRig is a booted freeze guest (scenario s_NAME of init.sh) whose
// serve reaches the simulator through a guestfwd (TLS, as serve sends the
// token in plain text only to loopback), and its tree through a hostfwd;
// the QEMU monitor freezes it.
type freezeRig struct {
	m    *Machine
	g    *guest
	sim  *gatewaysim.Server
	tree *client.Client // nil until dialTree
	port int            // the tree's hostfwd port
	mon  net.Conn
}

// freezeToken is the guest's bot token; it must never be printed.
const freezeToken = "FREEZE-TOKEN-do-not-print"

// bootFreezeGuest boots the guest with the extra guestfwd rules fwd
// ("" or ",guestfwd=..."), runs scenario and, when the scenario is
// "freeze", waits for its serve's tree with shard 0 READY. The machine,
// the simulator and the tree end with the test.
func bootFreezeGuest(t *testing.T, ctx context.Context, fwd, scenario string) *freezeRig {
	t.Helper()
	k := kit(t)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := certs.NewCA("freeze CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(certs.Server, "host", []string{guestAddr}, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := gatewaysim.New(gatewaysim.Config{Listener: gl, Token: freezeToken, Shards: 1, MaxConcurrency: 1, HeartbeatInterval: time.Minute,
		TLS: &tls.Config{Certificates: []tls.Certificate{server.TLS()}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	bin := filepath.Join(t.TempDir(), "shardfs")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/shardfs")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build of cmd/shardfs: %v\n%s", err, out)
	}
	kernel := kernelImage(t, k)
	initrd := guestImage(t, k, tlsModules, func(im *initramfs.Image) {
		im.Copy("bin/shardfs", bin, 0o755)
		im.Text("etc/shardfs/token", []byte(freezeToken), 0o600)
		im.Text("etc/shardfs/ca.crt", certs.CertPEM(ca.Cert), 0o644)
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the hostfwd
	if err != nil {
		t.Fatal(err)
	}
	treePort := hl.Addr().(*net.TCPAddr).Port
	hl.Close()
	monitor := filepath.Join(t.TempDir(), "monitor.sock")
	fwd = fmt.Sprintf("guestfwd=tcp:%s:5650-cmd:%s %s %s,hostfwd=tcp:127.0.0.1:%d-10.0.2.15:5640", guestAddr, self, relayArg, gl.Addr(), treePort) + fwd
	m, err := Boot(ctx, Config{
		QEMU: k.QEMU, Kernel: kernel, Initrd: initrd, Ports: []string{"ctl"}, MemoryMiB: 512,
		NIC: []string{"-netdev", "user,id=n0,restrict=on," + fwd, "-device", "virtio-net-pci,netdev=n0",
			"-monitor", "unix:" + monitor + ",server=on,wait=off"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &freezeRig{m: m, g: &guest{m: m}, sim: sim, port: treePort}
	t.Cleanup(func() {
		if r.tree != nil {
			r.tree.Close()
		}
		if r.mon != nil {
			r.mon.Close()
		}
		m.Kill()
		m.Wait()
		if t.Failed() || testing.Verbose() {
			t.Logf("console:\n%s", m.Console)
		}
	})
	if _, err := r.g.expect(ctx, "next"); err != nil {
		t.Fatalf("boot: %v", err)
	}
	if err := r.g.send("run " + scenario); err != nil {
		t.Fatal(err)
	}
	if r.mon, err = net.Dial("unix", monitor); err != nil {
		t.Fatal(err)
	}
	if scenario == "freeze" {
		if _, err := r.g.expect(ctx, "at frozen"); err != nil {
			t.Fatal(err)
		}
		r.dialTree(t, ctx)
	}
	return r
}

// dialTree dials the guest's tree once shard 0 is READY there.
func (r *freezeRig) dialTree(t *testing.T, ctx context.Context) {
	t.Helper()
	if r.tree != nil {
		r.tree.Close()
		r.tree = nil
	}
	var c *client.Client
	if err := poll.Until(ctx, "the guest's tree through the hostfwd, shard 0 READY", 2*time.Minute, 200*time.Millisecond, func() error {
		var err error
		c, err = client.Dial(ctx, fmt.Sprintf("tcp!127.0.0.1!%d", r.port))
		if err != nil {
			return err
		}
		s, err := c.ReadFile("0/state")
		if err == nil && strings.TrimSpace(string(s)) != "READY" {
			err = fmt.Errorf("0/state %q", s)
		}
		if err != nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r.tree = c
}
