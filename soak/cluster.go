package soak

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Cluster is an etcd cluster of child processes (DESIGN 8: one member
// killed, the leader changed, one member partitioned). Each member
// advertises a Proxy in front of its peer port: Partition cuts that proxy
// (nobody reaches the member) and makes every other member's proxy refuse
// the member's own connections (it reaches nobody), the cut-proxy style of
// the node partition. Clients reach the members directly.
type Cluster struct {
	Members []*Etcd
	peers   []*Proxy // Members[i]'s peer proxy
}

// BuildEtcd builds the etcd server of a test's cluster (package
// soak/etcdchild) into a test folder and returns its path: a test binary
// re-executed as etcd (os.Executable) carries the race detector under
// -race, which slows a member enough for elections to come and go at a
// TTL of 3 s; this one is built without it.
func BuildEtcd(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "etcdchild")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/shardfs/shardfs/soak/etcdchild").CombinedOutput()
	if err != nil {
		t.Fatalf("go build soak/etcdchild: %v\n%s", err, out)
	}
	return bin
}

// NewCluster prepares n members that exe (a binary calling MaybeRunEtcd)
// runs with their data under dir; Start starts them.
func NewCluster(exe, dir string, n int) (*Cluster, error) {
	c := &Cluster{}
	var initial []string
	for i := range n {
		e, err := NewEtcd(exe, filepath.Join(dir, fmt.Sprintf("m%d", i+1)))
		if err != nil {
			return nil, err
		}
		p, err := NewProxy(e.peer)
		if err != nil {
			c.Close()
			return nil, err
		}
		e.name, e.advPeer = fmt.Sprintf("m%d", i+1), p.Addr()
		initial = append(initial, e.name+"=http://"+p.Addr())
		c.Members, c.peers = append(c.Members, e), append(c.peers, p)
	}
	for i, e := range c.Members {
		e.cluster = strings.Join(initial, ",")
		c.peers[i].WatchDialers(c.pids)
	}
	return c, nil
}

func (c *Cluster) pids() []int {
	var out []int
	for _, e := range c.Members {
		if pid := e.Pid(); pid != 0 {
			out = append(out, pid)
		}
	}
	return out
}

// Start starts every member at once (none is ready before a quorum is)
// and waits for all of them.
func (c *Cluster) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Members))
	for i, e := range c.Members {
		wg.Go(func() { errs[i] = e.Start(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, e := range c.Members {
		out = append(out, e.Endpoint)
	}
	return out
}

// Leader returns the member that leads, as the first member answering
// cli's Status says.
func (c *Cluster) Leader(ctx context.Context, cli *clientv3.Client) (*Etcd, error) {
	for _, e := range c.Members {
		if !e.Running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, e.Endpoint)
		cancel()
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, m := range c.Members {
			if !m.Running() {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ms, err := cli.Status(sctx, m.Endpoint)
			cancel()
			if err == nil && ms.Header.MemberId == st.Leader {
				return m, nil
			}
		}
	}
	return nil, errors.New("etcd cluster: no member names a leader")
}

// Partition cuts e off from the other members, both ways.
func (c *Cluster) Partition(e *Etcd) {
	pid := e.Pid()
	for i, m := range c.Members {
		if m == e {
			c.peers[i].Cut()
		} else {
			c.peers[i].Refuse(pid)
		}
	}
}

// Heal ends e's partition.
func (c *Cluster) Heal(e *Etcd) error {
	pid := e.Pid()
	var errs []error
	for i, m := range c.Members {
		if m == e {
			errs = append(errs, c.peers[i].Heal())
		} else {
			c.peers[i].Admit(pid)
		}
	}
	return errors.Join(errs...)
}

// Kill kills every member.
func (c *Cluster) Kill() {
	for _, e := range c.Members {
		e.Kill()
	}
}

// Close kills every member and closes the proxies.
func (c *Cluster) Close() {
	c.Kill()
	for _, p := range c.peers {
		p.Close()
	}
}
