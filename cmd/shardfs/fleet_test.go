package main

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// startFleetNode runs `serve --etcd` as node name of bot b against sim.
func startFleetNode(t *testing.T, bin string, sim *gatewaysim.Server, endpoint, name string, args ...string) *serveProc {
	t.Helper()
	base := []string{"serve", "--api", sim.APIURL(), "--listen", "tcp!127.0.0.1!0", "--backoff", "fixed:100ms",
		"--flavor", "discord", "--total", "auto", "--max-concurrency", "4",
		"--etcd", endpoint, "--bot", "b", "--node", name, "--etcd-ttl", "3s"}
	return startProc(t, bin, "sim-token", syscall.SIGKILL, append(base, args...)...)
}

// Two serve processes share 4 shards through one etcd: /owners, /members
// and /lease show the split; SIGTERM drains one (its shards resume on the
// other, no identify spent) and it exits 0; a third node with another
// total is refused with both plans named.
func TestServeFleet(t *testing.T) {
	srv := etcdtest.Start(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 4, MaxConcurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	bin := binDir(t)
	a := startFleetNode(t, bin, sim, srv.Endpoint, "a")
	b := startFleetNode(t, bin, sim, srv.Endpoint, "b")
	eventually(t, "4 shards READY across a and b", func() (bool, string) {
		sa, _ := dotlRead(a.root, "status")
		sb, _ := dotlRead(b.root, "status")
		return strings.Count(sa, " READY ")+strings.Count(sb, " READY ") == 4 && sa != "" && sb != "", "a:\n" + sa + "b:\n" + sb
	})
	eventually(t, "/members and /owners", func() (bool, string) {
		m, _ := dotlRead(a.root, "members")
		o, _ := dotlRead(b.root, "owners")
		lines := strings.Split(strings.TrimSpace(o), "\n")
		ok := strings.HasPrefix(m, "a ") && strings.Contains(m, "\nb ") && len(lines) == 4
		for _, l := range lines {
			f := strings.Fields(l)
			ok = ok && len(f) == 3 && (f[1] == "a" || f[1] == "b")
		}
		return ok, "members:\n" + m + "owners:\n" + o
	})
	lease, _ := dotlRead(a.root, "lease")
	for _, want := range []string{"backend etcd\n", "node a\n", "state member\n", "ttl 3s\n", "remaining "} {
		if !strings.Contains(lease, want) {
			t.Fatalf("/lease lacks %q:\n%s", want, lease)
		}
	}
	identifies := sim.Totals().Identifies
	a.stop(t, syscall.SIGTERM)
	eventually(t, "b to run all 4", func() (bool, string) {
		s, _ := dotlRead(b.root, "status")
		return strings.Count(s, " READY ") == 4, s
	})
	if tot := sim.Totals(); tot.Identifies != identifies || tot.MaxLiveSessions != 1 {
		t.Fatalf("after a's drain: %d identifies (before %d), at most %d live sessions a shard; want no new identify, never 2", tot.Identifies, identifies, tot.MaxLiveSessions)
	}

	c := command(t, bin, "serve", "--api", sim.APIURL(), "--listen", "tcp!127.0.0.1!0", "--flavor", "discord", "--total", "8",
		"--etcd", srv.Endpoint, "--bot", "b", "--node", "c")
	c.Env = append(c.Env, "SHARDFS_TOKEN=sim-token")
	done := make(chan error, 1)
	var out syncBuffer
	c.Stderr = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err == nil || !asExit(err, &ee) || !strings.Contains(out.String(), "total 4") || !strings.Contains(out.String(), "total 8") {
			t.Fatalf("serve with another total: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		c.Process.Kill()
		<-done
		t.Fatalf("serve with another total still runs after 30 s:\n%s", out.String())
	}
}

func asExit(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}
