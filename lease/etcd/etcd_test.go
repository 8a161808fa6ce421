package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

var plan16 = Plan{Flavor: "discord", Total: 16}

// join joins node to bot "b" of srv on a fake clock that the test never
// advances unless it wants renewals: the etcd lease itself runs on real
// time.
func join(t *testing.T, cli *clientv3.Client, node string, ttl time.Duration) (*Member, *clock.Fake, *logBuf) {
	t.Helper()
	log, buf := testLog(t)
	clk := clock.NewFake()
	m, err := Join(etcdtest.Ctx(t, 10*time.Second), Config{Client: cli, Bot: "b", Node: node, Plan: plan16, TTL: ttl, Clock: clk, Logger: log})
	if err != nil {
		t.Fatalf("Join(%s): %v", node, err)
	}
	t.Cleanup(func() { m.Close() })
	return m, clk, buf
}

func TestJoinPlan(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	join(t, cli, "a", 0)
	r, err := cli.Get(ctx, "/shardfs/b/plan")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != `{"flavor":"discord","total":16}` {
		t.Fatalf("plan key = %v, %v; want the first node's plan", r, err)
	}
	join(t, cli, "same-plan", 0)

	_, err = Join(ctx, Config{Client: cli, Bot: "b", Node: "c", Plan: Plan{"discord", 32}})
	if !errors.Is(err, ErrPlanMismatch) || !strings.Contains(err.Error(), "flavor discord total 16") || !strings.Contains(err.Error(), "flavor discord total 32") {
		t.Fatalf("Join with another total = %v; want ErrPlanMismatch naming both plans", err)
	}
	_, err = Join(ctx, Config{Client: cli, Bot: "b", Node: "c", Plan: Plan{"fluxer", 16}})
	if !errors.Is(err, ErrPlanMismatch) || !strings.Contains(err.Error(), "fluxer") {
		t.Fatalf("Join with another flavor = %v; want ErrPlanMismatch naming fluxer", err)
	}
	if r, _ := cli.Get(ctx, "/shardfs/b/members/c"); len(r.Kvs) != 0 {
		t.Fatalf("a refused node left its member key: %v", r.Kvs)
	}

	for _, garbage := range []string{"nonsense", `{"flavor":"discord","total":0}`, `{"flavor":"discord","total":16,"x":1}`, `{"total":16}`, ""} {
		if _, err := cli.Put(ctx, "/shardfs/g/plan", garbage); err != nil {
			t.Fatal(err)
		}
		_, err = Join(ctx, Config{Client: cli, Bot: "g", Node: "a", Plan: plan16})
		if !errors.Is(err, ErrBadPlan) || !strings.Contains(err.Error(), fmt.Sprintf("%q", garbage)) {
			t.Fatalf("Join over plan %q = %v; want ErrBadPlan quoting it", garbage, err)
		}
	}
}

func TestJoinNames(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 10*time.Second)
	for _, c := range []Config{
		{Bot: "b/members/x", Node: "a"},
		{Bot: "b", Node: "a/b"},
		{Bot: "b", Node: ""},
		{Bot: "b", Node: "a b"},
		{Bot: "", Node: "a"},
	} {
		c.Client, c.Plan = cli, plan16
		if _, err := Join(ctx, c); !errors.Is(err, ErrBadName) {
			t.Errorf("Join(bot %q, node %q) = %v; want ErrBadName", c.Bot, c.Node, err)
		}
	}
	if _, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: plan16, TTL: time.Second}); err == nil {
		t.Error("Join with a 1 s TTL succeeded; want an error")
	}
	join(t, cli, "a", 0)
	if _, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: plan16}); !errors.Is(err, ErrMemberExists) {
		t.Fatalf("second Join of node a = %v; want ErrMemberExists", err)
	}
}

func TestAcquireConflict(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, _, _ := join(t, cli, "a", 0)
	b, _, _ := join(t, srv.Client(), "b", 0)
	for id := 0; id < 8; id++ {
		var wg sync.WaitGroup
		gens, errs := make([]int64, 2), make([]error, 2)
		for i, m := range []*Member{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gens[i], errs[i] = m.Acquire(ctx, id)
			}()
		}
		wg.Wait()
		win := 0
		if errs[0] != nil {
			win = 1
		}
		lose := 1 - win
		if errs[win] != nil || !errors.Is(errs[lose], ErrShardTaken) {
			t.Fatalf("shard %d: Acquire errors %v; want one nil, one ErrShardTaken", id, errs)
		}
		winner := []string{"a", "b"}[win]
		if !strings.Contains(errs[lose].Error(), `node "`+winner+`"`) {
			t.Fatalf("shard %d: loser's error %q does not name the winner %s", id, errs[lose], winner)
		}
		r, err := cli.Get(ctx, a.ShardKey(id))
		if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != winner || r.Kvs[0].CreateRevision != gens[win] {
			t.Fatalf("shard %d key = %v, %v; want value %s, CreateRevision %d", id, r.Kvs, err, winner, gens[win])
		}
		again, err := []*Member{a, b}[win].Acquire(ctx, id)
		if err != nil || again != gens[win] {
			t.Fatalf("shard %d: the winner's second Acquire = %d, %v; want %d, nil", id, again, err, gens[win])
		}
	}
	if _, err := a.Acquire(ctx, 16); !errors.Is(err, ErrUnknownShard) {
		t.Fatalf("Acquire(16) of a 16-shard plan = %v; want ErrUnknownShard", err)
	}
	owners, err := b.Owners(ctx)
	if err != nil || len(owners) != 8 {
		t.Fatalf("Owners() = %v, %v; want 8 holders", owners, err)
	}
	for i, h := range owners {
		if h.Shard != i || !h.Live {
			t.Fatalf("Owners()[%d] = %+v; want shard %d, live", i, h, i)
		}
	}
}

func TestGuardedAfterRecreate(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, _, _ := join(t, cli, "a", 0)
	b, _, _ := join(t, cli, "b", 0)
	sess := a.Prefix() + "sessions/1"
	g1, err := a.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Guarded(ctx, 1, g1, clientv3.OpPut(sess, "from a")); err != nil {
		t.Fatalf("Guarded by the owner: %v", err)
	}
	if err := a.Release(ctx, 1, g1); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	g2, err := b.Acquire(ctx, 1)
	if err != nil || g2 <= g1 {
		t.Fatalf("b.Acquire(1) = %d, %v; want a generation above %d", g2, err, g1)
	}
	if _, err := a.Guarded(ctx, 1, g1, clientv3.OpPut(sess, "stale a")); !errors.Is(err, ErrGeneration) {
		t.Fatalf("Guarded with the old generation = %v; want ErrGeneration", err)
	}
	if err := a.Release(ctx, 1, g1); !errors.Is(err, ErrGeneration) {
		t.Fatalf("Release with the old generation = %v; want ErrGeneration", err)
	}
	if r, _ := cli.Get(ctx, a.ShardKey(1)); len(r.Kvs) != 1 || r.Kvs[0].CreateRevision != g2 {
		t.Fatalf("a stale Release touched b's key: %v", r.Kvs)
	}
	if _, err := b.Guarded(ctx, 1, g2, clientv3.OpPut(sess, "from b")); err != nil {
		t.Fatalf("Guarded by the new owner: %v", err)
	}
	if r, _ := cli.Get(ctx, sess); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "from b" {
		t.Fatalf("sessions/1 = %v; want \"from b\"", r.Kvs)
	}
	// Generation 0 would match an absent key.
	if _, err := a.Guarded(ctx, 2, 0, clientv3.OpPut(a.Prefix()+"sessions/2", "x")); !errors.Is(err, ErrGeneration) {
		t.Fatalf("Guarded with generation 0 = %v; want ErrGeneration", err)
	}
	if r, _ := cli.Get(ctx, a.Prefix()+"sessions/2"); len(r.Kvs) != 0 {
		t.Fatal("Guarded with generation 0 wrote")
	}
}

// TestExpiryRemovesKeys pauses node a (its fake clock never moves, so it
// never renews): etcd expires its lease on real time, its keys go, and b
// acquires its shards with new generations. a's stale generation is refused
// even though a never noticed.
func TestExpiryRemovesKeys(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 30*time.Second)
	a, aclk, _ := join(t, cli, "a", 2*time.Second)
	c, _, _ := join(t, cli, "c", 2*time.Second)
	b, _, _ := join(t, cli, "b", 0)
	gens := map[int]int64{}
	for id := 0; id < 4; id++ {
		g, err := a.Acquire(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		gens[id] = g
	}
	start := time.Now()
	// A real server's expiry: poll, with a bound.
	for {
		r, err := cli.Get(ctx, a.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range r.Kvs {
			if k := string(kv.Key); strings.Contains(k, "/shards/") || strings.HasSuffix(k, "/members/a") || strings.HasSuffix(k, "/members/c") {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("keys of the expired lease still present after %v: %v", time.Since(start), keys)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("a's keys gone %v after its last renewal (TTL 2s)", time.Since(start).Round(10*time.Millisecond))
	if ms, err := b.Members(ctx); err != nil || fmt.Sprint(ms) != "[b]" {
		t.Fatalf("Members() = %v, %v; want [b]", ms, err)
	}
	for id := 0; id < 4; id++ {
		g, err := b.Acquire(ctx, id)
		if err != nil || g <= gens[id] {
			t.Fatalf("b.Acquire(%d) = %d, %v; want above a's %d", id, g, err, gens[id])
		}
		if _, err := a.Guarded(ctx, id, gens[id], clientv3.OpPut(a.Prefix()+"sessions/0", "stale")); !errors.Is(err, ErrGeneration) {
			t.Fatalf("a.Guarded(%d) after expiry = %v; want ErrGeneration", id, err)
		}
	}
	// c wakes and acquires before its first renewal: etcd's answer ends
	// its membership.
	if _, err := c.Acquire(ctx, 9); !errors.Is(err, ErrLeaseLost) || !isDone(c) {
		t.Fatalf("Acquire on an expired lease = %v, done %v; want ErrLeaseLost, done", err, isDone(c))
	}
	// a wakes: its first renewal learns the lease is gone.
	after := make(chan error, 1)
	a.mu.Lock()
	a.afterRenew = func(err error) { after <- err }
	a.mu.Unlock()
	aclk.Advance(a.TTL() / 3)
	select {
	case err := <-after:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renewal of an expired lease = %v; want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal after the wake-up")
	}
	if !isDone(a) {
		t.Fatal("a still a member after etcd expired its lease")
	}
	// It joins again; its acquisitions are new generations.
	a.Close()
	a2, _, _ := join(t, cli, "a", 2*time.Second)
	if err := b.Release(ctx, 0, mustGen(t, ctx, b, 0)); err != nil {
		t.Fatal(err)
	}
	g, err := a2.Acquire(ctx, 0)
	if err != nil || g <= gens[0] {
		t.Fatalf("a2.Acquire(0) = %d, %v; want a new generation", g, err)
	}
}

func mustGen(t *testing.T, ctx context.Context, m *Member, id int) int64 {
	t.Helper()
	g, err := m.Acquire(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestCloseRevokes(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, _, _ := join(t, cli, "a", 0)
	b, _, _ := join(t, cli, "b", 0)
	if _, err := a.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if r, _ := cli.Get(ctx, a.ShardKey(3)); len(r.Kvs) != 0 {
		t.Fatalf("shard key after Close = %v; want deleted at once", r.Kvs)
	}
	if ms, _ := b.Members(ctx); fmt.Sprint(ms) != "[b]" {
		t.Fatalf("Members() after a's Close = %v; want [b]", ms)
	}
	if _, err := b.Acquire(ctx, 3); err != nil {
		t.Fatalf("b.Acquire(3) after a's Close: %v", err)
	}
}

func TestMalformedKeys(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, _, logs := join(t, cli, "a", 0)
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	p := a.Prefix()
	for k, v := range map[string]string{
		"members/x/y":     "x/y", // no member of this bot: names are one segment
		"members/nolease": "nolease",
		"members/d":       "e",
		"shards/abc":      "a",
		"shards/16":       "a",
		"shards/007":      "a",
		"shards/-1":       "a",
		"shards/5":        "ghost",
		"shards/6":        "two words",
	} {
		opts := []clientv3.OpOption{clientv3.WithLease(g.ID)}
		if k == "members/nolease" {
			opts = nil
		}
		if _, err := cli.Put(ctx, p+k, v, opts...); err != nil {
			t.Fatal(err)
		}
	}
	// Another bot whose name starts like this one's.
	if _, err := cli.Put(ctx, "/shardfs/bb/members/z", "z", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		ms, err := a.Members(ctx)
		if err != nil || fmt.Sprint(ms) != "[a]" {
			t.Fatalf("Members() = %v, %v; want [a]", ms, err)
		}
		owners, err := a.Owners(ctx)
		if err != nil || len(owners) != 2 {
			t.Fatalf("Owners() = %+v, %v; want shards 2 and 5", owners, err)
		}
		if h := owners[0]; h.Shard != 2 || h.Node != "a" || !h.Live {
			t.Fatalf("Owners()[0] = %+v; want shard 2 of live a", h)
		}
		if h := owners[1]; h.Shard != 5 || h.Node != "ghost" || h.Live {
			t.Fatalf("Owners()[1] = %+v; want shard 5 of ghost, not live", h)
		}
	}
	out := logs.String()
	for _, k := range []string{"members/x/y", "members/nolease", "members/d", "shards/abc", "shards/16", "shards/007", "shards/-1", "shards/5", "shards/6"} {
		if n := strings.Count(out+"\n", "key="+p+k+" ") + strings.Count(out, "key="+p+k+"\n"); n != 1 {
			t.Errorf("%d log lines about %s after two reads; want 1", n, k)
		}
	}
	if strings.Contains(out, "/shardfs/bb/") {
		t.Error("a key of bot bb was read as bot b's")
	}
}

// TestServerDown: every call against a stopped server ends with a clear
// error within its context, the renewal loop loses the membership at the
// deadline, and nothing panics.
func TestServerDown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a, clk, _ := join(t, cli, "a", 3*time.Second)
	ctx := etcdtest.Ctx(t, 20*time.Second)
	g, err := a.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	after := make(chan error, 4)
	a.mu.Lock()
	a.afterRenew = func(err error) { after <- err }
	a.mu.Unlock()
	srv.Stop()

	short := func() context.Context { return etcdtest.Ctx(t, 500*time.Millisecond) }
	if _, err := a.Acquire(short(), 2); err == nil || !strings.Contains(err.Error(), "acquire shard 2") {
		t.Fatalf("Acquire with etcd down = %v; want an error naming the call", err)
	}
	if _, err := a.Guarded(short(), 1, g, clientv3.OpPut(a.Prefix()+"sessions/1", "x")); err == nil || errors.Is(err, ErrGeneration) || !strings.Contains(err.Error(), "guarded write of shard 1") {
		t.Fatalf("Guarded with etcd down = %v; want a transport error, not ErrGeneration", err)
	}
	if _, err := a.Owners(short()); err == nil || !strings.Contains(err.Error(), "list owners") {
		t.Fatalf("Owners with etcd down = %v; want an error", err)
	}
	if _, err := Join(short(), Config{Client: cli, Bot: "b", Node: "c", Plan: plan16}); err == nil {
		t.Fatal("Join with etcd down succeeded")
	}
	clk.Advance(a.TTL() / 3)
	select {
	case err := <-after:
		if err == nil || errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renewal with etcd down = %v; want a transport error", err)
		}
		t.Logf("renewal with etcd down: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("renewal with etcd down did not end within 10s")
	}
	clk.Advance(a.TTL())
	if !isDone(a) || !errors.Is(a.Err(), ErrLeaseLost) {
		t.Fatalf("after the deadline with etcd down: Err %v; want ErrLeaseLost", a.Err())
	}
	if err := a.Close(); err == nil {
		t.Log("Close with etcd down: revoke reported no error")
	} else {
		t.Logf("Close with etcd down: %v", err)
	}
}

// countCalls counts the client's gRPC requests by method.
type countCalls struct {
	mu sync.Mutex
	n  map[string]int
	on atomic.Bool
}

func (c *countCalls) add(method string) {
	if !c.on.Load() {
		return
	}
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
}

func (c *countCalls) opts() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.add(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.add(method)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// TestRenewalCost measures the etcd requests of a node at steady state:
// one KeepAliveOnce (one LeaseKeepAlive stream: one send, one answer) per
// TTL/3, whatever the number of shards it owns, and no other request.
func TestRenewalCost(t *testing.T) {
	srv := etcdtest.Start(t)
	calls := &countCalls{n: map[string]int{}}
	cli := srv.Client(calls.opts()...)
	a, clk, _ := join(t, cli, "a", 0)
	ctx := etcdtest.Ctx(t, 30*time.Second)
	for id := 0; id < plan16.Total; id++ {
		if _, err := a.Acquire(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	after := make(chan error, 1)
	a.mu.Lock()
	a.afterRenew = func(err error) { after <- err }
	a.mu.Unlock()
	calls.on.Store(true)
	const renewals = 30 // 100 s of fake time at TTL 10 s
	for i := 0; i < renewals; i++ {
		clk.Advance(a.TTL() / 3)
		select {
		case err := <-after:
			if err != nil {
				t.Fatalf("renewal %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("renewal %d did not end within 10s", i)
		}
	}
	calls.on.Store(false)
	calls.mu.Lock()
	defer calls.mu.Unlock()
	t.Logf("requests during %d renewals with %d shards owned: %v", renewals, plan16.Total, calls.n)
	const ka = "/etcdserverpb.Lease/LeaseKeepAlive"
	if calls.n[ka] != renewals || len(calls.n) != 1 {
		t.Fatalf("requests during %d renewals = %v; want %d %s and nothing else", renewals, calls.n, renewals, ka)
	}
}

// TestRealClockRenews runs the loop on real time against the real server
// until it has renewed four times, a third of the TTL apart, and so for
// longer than the TTL: the membership lasts and its key stays. It watches
// a real server's clock, so it polls, bounded by ctx rather than by a
// count of renewals per second.
func TestRealClockRenews(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	log, _ := testLog(t)
	ctx := etcdtest.Ctx(t, 30*time.Second)
	a, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: plan16, TTL: 3 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	renewals := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.renewals
	}
	for renewals() < 4 {
		if err := a.Err(); err != nil {
			t.Fatalf("membership ended on real time after %d renewals: %v", renewals(), err)
		}
		if rem := a.Remaining(); rem <= 0 || rem > 2*time.Second {
			t.Fatalf("Remaining() = %v; want in (0, TTL-1s]", rem)
		}
		if d := time.Until(a.Deadline()); d <= 0 || d > 2*time.Second {
			t.Fatalf("Deadline() in %v; want in (0, TTL-1s]", d)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d renewals before the bound: %v", renewals(), ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	if ms, err := a.Members(ctx); err != nil || fmt.Sprint(ms) != "[a]" {
		t.Fatalf("Members() after 4 renewals = %v, %v; want [a]", ms, err)
	}
}
