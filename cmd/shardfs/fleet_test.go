package main

import (
	clientv3 "go.etcd.io/etcd/client/v3"

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

// A fleet node with a wrong token and a fixed --total checks the token
// before it joins, and exits: one that joined took shards from healthy
// nodes and kept them FATAL (the attack on issue 22).
func TestServeFleetWrongTokenDoesNotJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 4, MaxConcurrency: 4, Token: "right-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	cmd := command(t, binDir(t), "serve", "--api", sim.APIURL(), "--listen", "tcp!127.0.0.1!0", "--flavor", "discord",
		"--total", "4", "--etcd", srv.Endpoint, "--bot", "b", "--node", "w", "--etcd-ttl", "3s")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN=wrong-token")
	var output syncBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(2 * time.Minute): // a bound on a hang: a node that joined runs on
		cmd.Process.Kill()
		<-exited
		t.Fatalf("serve --etcd with a wrong token still ran after 2 min; want it to exit before joining:\n%s", output.String())
	}
	out := output.String()
	if err == nil || !strings.Contains(out, "not joining") {
		t.Fatalf("serve --etcd with a wrong token = %v:\n%s\nwant it to exit before joining", err, out)
	}
	if strings.Contains(out, "wrong-token") {
		t.Error("the token is in serve's output")
	}
	r, err := srv.Client().Get(etcdtest.Ctx(t, 5*time.Second), "/shardfs/b/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		if k := string(kv.Key); strings.Contains(k, "/members/") || strings.Contains(k, "/shards/") {
			t.Errorf("etcd holds %s after a node with a wrong token ran", k)
		}
	}
}
