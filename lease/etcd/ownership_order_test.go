package etcd

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// slowShards records every grant in the order the core would apply it,
// and holds the first grant whose deadline is past after (a renewal)
// until release is closed: a slow SetLease.
type slowShards struct {
	*recShards
	mu      sync.Mutex
	armed   bool
	after   time.Time
	applied []core.LeaseGrant
	blocked chan int
	release chan struct{}
}

func (s *slowShards) SetLease(g core.LeaseGrant) {
	s.mu.Lock()
	hold := s.armed && g.Owner && g.Generation != 0 && g.Deadline.After(s.after)
	if hold {
		s.armed = false
	}
	s.mu.Unlock()
	if hold {
		s.blocked <- g.Shard
		<-s.release
	}
	s.mu.Lock()
	s.applied = append(s.applied, g)
	s.mu.Unlock()
	s.recShards.SetLease(g)
}

// Issue 22 item 4: renewGrants copied the owned set and called SetLease
// outside the lock, so a renewal held up by a slow SetLease handed the
// core a grant of a shard the reconcile had stopped meanwhile (its key
// lost), restarting it on its old generation while the key was gone. A
// stop must win: no grant of a generation with a live deadline may follow
// its stop.
func TestOwnershipStaleRenewalNeverRestarts(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	plan := Plan{Flavor: "discord", Total: 2}
	slow := &slowShards{recShards: newRecShards(), blocked: make(chan int, 1), release: make(chan struct{})}
	a := startOwnershipWith(t, cli, "a", plan, 2, func(cfg *OwnershipConfig) { cfg.Shards = slow })
	waitFor(t, "a to own both shards", func() bool { return len(slow.owned(a.clk.Now())) == 2 })
	first := keys(t, cli)

	slow.mu.Lock()
	slow.armed = true
	slow.after = a.o.Status().Deadline
	slow.mu.Unlock()
	a.clk.Advance(DefaultTTL / 3) // the renewal timer fires; renewGrants follows
	var held int
	select {
	case held = <-slow.blocked:
	case <-time.After(time.Minute): // a bound on a hang only
		t.Fatal("no renewal grant reached SetLease")
	}
	lost := 1 - held
	gen := first[lost][1]
	if _, err := cli.Delete(context.Background(), "/shardfs/b/shards/"+[]string{"0", "1"}[lost]); err != nil {
		t.Fatal(err)
	}
	stopped := func() int {
		slow.mu.Lock()
		defer slow.mu.Unlock()
		for i, g := range slow.applied {
			if g.Shard == lost && itoa(g.Generation) == gen && !g.Deadline.After(a.clk.Now()) {
				return i
			}
		}
		return -1
	}
	waitFor(t, "the reconcile to stop the shard whose key went", func() bool { return stopped() >= 0 })
	close(slow.release)
	// The next renewal's grants come from the same goroutine, after the
	// held renewal has finished.
	before := a.o.Status().Deadline
	waitFor(t, "a's lease renewed again", func() bool { return a.advanceLeased(DefaultTTL / 3) })
	waitFor(t, "the next renewal's grants", func() bool {
		slow.mu.Lock()
		defer slow.mu.Unlock()
		for _, g := range slow.applied {
			if g.Shard == held && g.Deadline.After(before) {
				return true
			}
		}
		return false
	})
	from := stopped()
	slow.mu.Lock()
	defer slow.mu.Unlock()
	for _, g := range slow.applied[from:] {
		if g.Shard == lost && itoa(g.Generation) == gen && g.Deadline.After(a.clk.Now()) {
			t.Fatalf("shard %d granted generation %s until %v after its stop; grants %+v", lost, gen, g.Deadline, slow.applied)
		}
	}
}

func itoa(n uint64) string { return fmt.Sprint(n) }
