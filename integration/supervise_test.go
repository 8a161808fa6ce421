package integration

import (
	"context"
	"fmt"
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

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// lockedBuffer collects a subprocess's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestV9fsSupervise: the kernel's v9fs mounts the tree of `shardfs
// supervise` (2 children, 4 shards, against the simulator) and the guest
// runs the mount reads and the shell examples on it.
func TestV9fsSupervise(t *testing.T) {
	k := kit(t)
	const token = "V9FS-SUPERVISE-TOKEN-1234"
	bin := filepath.Join(t.TempDir(), "shardfs")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/shardfs").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: shards, MaxConcurrency: shards})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sock := filepath.Join(t.TempDir(), "tree.sock")
	cmd := exec.Command(bin, "supervise", "--flavor", "discord", "--api", sim.APIURL(), "--total", "4", "--processes", "2",
		"--max-concurrency", "4", "--backoff", "fixed:100ms", "--listen", "unix!"+sock)
	cmd.Env = append(os.Environ(), "SHARDFS_TOKEN="+token)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("supervise exited with %v", err)
		}
		if t.Failed() {
			t.Logf("supervise's stderr:\n%s", stderr)
		}
	}()
	// A process boundary: poll, bounded.
	if err := poll.Until(t.Context(), "supervise's two children ready", 30*time.Second, 50*time.Millisecond, func() error {
		if n := strings.Count(stderr.String(), `msg="child ready"`); n != 2 {
			return fmt.Errorf("%d children ready", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kernel := kernelImage(t, k)
	initrd := guestImage(t, k, guestModules, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	m, err := Boot(ctx, Config{QEMU: k.QEMU, Kernel: kernel, Initrd: initrd, Ports: guestPorts})
	if err != nil {
		t.Fatal(err)
	}
	var relays sync.WaitGroup
	defer func() {
		m.Kill()
		m.Wait()
		relays.Wait()
		if t.Failed() || testing.Verbose() {
			t.Logf("console:\n%s", m.Console)
		}
	}()
	g := &guest{m: m}
	if _, err := g.expect(ctx, "next"); err != nil {
		t.Fatalf("boot: %v", err)
	}
	// The port is relayed from the scenario that mounts it on: the
	// parent drops a connection that sends no Tversion within 10 s.
	port := m.Ports["dotl"]
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	relays.Go(func() { io.Copy(c, port); c.Close() })
	relays.Go(func() { io.Copy(port, c); port.Close() })
	var text strings.Builder
	for _, sc := range []string{"mount", "examples"} {
		if err := g.send("run " + sc); err != nil {
			t.Fatal(err)
		}
		s, err := g.expect(ctx, "end "+sc)
		text.WriteString(s)
		if err != nil {
			t.Fatalf("%s: %v", sc, err)
		}
		s, err = g.expect(ctx, "next")
		text.WriteString(s)
		if err != nil {
			t.Fatalf("%s: %v", sc, err)
		}
	}
	r := &result{text: text.String()}
	r.parse()
	if got := r.word(t, "state"); got != "READY" {
		t.Errorf("guest: 0/state through the parent = %q; want READY", got)
	}
	r.ok(t, "ls-root", "ls-shard", "sequence", "reconnects", "diag")
	if ls := strings.Join(r.out["ls-root"], "\n"); !strings.Contains(ls, "children") || !strings.Contains(ls, "dispatch") {
		t.Errorf("guest: ls of the parent's root lacks children or dispatch:\n%s", ls)
	}
	for _, e := range examples {
		r.ok(t, e.script)
	}
	if out := r.out["watch-states.sh"]; len(out) < shards {
		t.Errorf("watch-states.sh printed %q; want a line per shard", out)
	}
	if err := g.send("poweroff"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the guest did not power off within 30 s")
	}
}
