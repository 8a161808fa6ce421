package identify

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// The tests run against a real etcd, whose leases run on real time. They
// use a key lease of 2 s (etcd's minimum) and a hold of 0.5 s instead of
// 7 s and 1.5 s, so the gap they guarantee between two slots of a bucket
// is testWindow = 1 s instead of 5 s (2 − 0.5 ≥ 1; the same argument as
// 7 − 1.5 ≥ 5).
const (
	testTTL    = 2 * time.Second
	testHold   = 500 * time.Millisecond
	testRetry  = 200 * time.Millisecond
	testWindow = time.Second
	// etcd checks for expired leases every 500 ms, and a loaded machine
	// under the race detector adds its own delay.
	expirySlack = 1500 * time.Millisecond
)

const prefix = "/shardfs/bot/"

// Close stops every goroutine a pacer started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type grant struct {
	node  string
	shard int
	at    time.Time
}

// recorder records every grant, of every node, in order.
type recorder struct {
	mu     sync.Mutex
	grants []grant
	ch     chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1000)} }

func (r *recorder) fn(node string, shard int) func() {
	return func() {
		r.mu.Lock()
		r.grants = append(r.grants, grant{node, shard, time.Now()})
		r.mu.Unlock()
		r.ch <- struct{}{}
	}
}

func (r *recorder) snapshot() []grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.grants)
}

// waitN waits, with a bound, for n grants in all.
func (r *recorder) waitN(t *testing.T, n int, bound time.Duration) []grant {
	t.Helper()
	deadline := time.After(bound)
	for {
		if g := r.snapshot(); len(g) >= n {
			return g
		}
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("%d grants within %v, want %d: %v", len(r.snapshot()), bound, n, r.snapshot())
		}
	}
}

// request asks for a slot and records a grant given at once too.
func (r *recorder) request(p *Pacer, node string, shard int, op bool) func() {
	now, cancel := p.Request(shard, op, r.fn(node, shard))
	if now {
		r.fn(node, shard)()
	}
	return cancel
}

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newPacer(t *testing.T, c *clientv3.Client, node string, mc int, log *logBuf) *Pacer {
	t.Helper()
	cfg := Config{Client: c, Prefix: prefix, Node: node, MaxConcurrency: mc, KeyTTL: testTTL, Hold: testHold, Retry: testRetry}
	if log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func counterUsed(t *testing.T, c *clientv3.Client) string {
	t.Helper()
	r, err := c.Get(etcdtest.Ctx(t, 5*time.Second), prefix+"identify/starts")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return strings.Fields(string(r.Kvs[0].Value))[0]
}

// Two nodes, max_concurrency 1, 32 shards requested together: every shard
// is granted once, and no two grants of the bucket, whichever node, are
// closer than the window.
func TestTwoNodesOneBucketPaced(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newPacer(t, srv.Client(), "a", 1, nil)
	b := newPacer(t, srv.Client(), "b", 1, nil)
	r := newRecorder()
	for s := 0; s < 32; s += 2 {
		r.request(a, "a", s, false)
		r.request(b, "b", s+1, false)
	}
	// A bound on a hang: on a loaded machine slow etcd writes lose slots
	// past their hold, and each costs a retry (28 of 32 in 2m22s once).
	g := r.waitN(t, 32, 2*32*(testTTL+expirySlack)+time.Minute)
	seen := map[int]bool{}
	nodes := map[string]int{}
	minGap := time.Hour
	for i, x := range g {
		if seen[x.shard] {
			t.Errorf("shard %d granted twice", x.shard)
		}
		seen[x.shard] = true
		nodes[x.node]++
		if want := x.shard%2 == 0; want != (x.node == "a") {
			t.Errorf("shard %d granted on node %s", x.shard, x.node)
		}
		if i > 0 {
			gap := x.at.Sub(g[i-1].at)
			minGap = min(minGap, gap)
			if gap < testWindow {
				t.Errorf("grants %d (%s shard %d) and %d (%s shard %d) %v apart, want at least %v", i-1, g[i-1].node, g[i-1].shard, i, x.node, x.shard, gap, testWindow)
			}
		}
	}
	if nodes["a"] != 16 || nodes["b"] != 16 {
		t.Errorf("grants per node %v, want 16 each", nodes)
	}
	// Each node's queue is FIFO: its shards come in the order asked.
	for _, node := range []string{"a", "b"} {
		var order []int
		for _, x := range g {
			if x.node == node {
				order = append(order, x.shard)
			}
		}
		if !slices.IsSorted(order) {
			t.Errorf("node %s granted in order %v, want ascending", node, order)
		}
	}
	t.Logf("32 grants in %v, closest two %v apart", g[31].at.Sub(g[0].at), minGap)
}

// The budget holds across nodes: automatic requests stop at total −
// reserve, operators' go to the total and no further.
func TestBudgetAcrossNodes(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	a := newPacer(t, srv.Client(), "a", 64, nil)
	b := newPacer(t, srv.Client(), "b", 64, nil)
	for _, p := range []*Pacer{a, b} {
		p.SetStartLimit(core.StartLimit{Total: 20, Remaining: 20, MaxConcurrency: 64})
		p.SetReserve(2)
	}
	r := newRecorder()
	for s := 0; s < 32; s += 2 {
		r.request(a, "a", s, false)
		r.request(b, "b", s+1, false)
	}
	r.waitN(t, 18, 2*time.Minute) // a bound on a hang (11 of 18 in 30 s under load once)
	// Absence of a grant cannot be waited for: give both nodes a few
	// retries' worth of real time to overspend.
	time.Sleep(5 * testRetry)
	if g := r.snapshot(); len(g) != 18 {
		t.Fatalf("%d automatic grants, want 18 (total 20, reserve 2)", len(g))
	}
	if got := counterUsed(t, c); got != "18" {
		t.Errorf("counter %s, want 18", got)
	}
	if a.Waiting()+b.Waiting() != 14 {
		t.Errorf("waiting %d + %d, want 14", a.Waiting(), b.Waiting())
	}
	for _, p := range []*Pacer{a, b} {
		if w := p.BudgetWait(false); w.Before(time.Now().Add(23 * time.Hour)) {
			t.Errorf("BudgetWait(automatic) = %v, want about a day from now", w)
		}
		if w := p.BudgetWait(true); !w.IsZero() {
			t.Errorf("BudgetWait(operator) = %v, want zero", w)
		}
	}
	r.request(b, "b", 40, true)
	r.request(a, "a", 41, true)
	r.waitN(t, 20, 30*time.Second)
	r.request(b, "b", 42, true)
	time.Sleep(5 * testRetry)
	if g := r.snapshot(); len(g) != 20 {
		t.Fatalf("%d grants, want 20 (the total)", len(g))
	}
	if got := counterUsed(t, c); got != "20" {
		t.Errorf("counter %s, want 20", got)
	}
	if w := b.BudgetWait(true); w.IsZero() {
		t.Error("BudgetWait(operator) zero with the total spent")
	}
}

// A discovery answer raises the count used; a later, lagging one does not
// lower it.
func TestStartLimitRaisesUsed(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newPacer(t, srv.Client(), "a", 64, nil)
	a.SetStartLimit(core.StartLimit{Total: 20, Remaining: 5, ResetAfter: time.Hour, MaxConcurrency: 64})
	a.SetReserve(2)
	r := newRecorder()
	for s := 0; s < 8; s++ {
		r.request(a, "a", s, false)
	}
	r.waitN(t, 3, 30*time.Second)
	a.SetStartLimit(core.StartLimit{Total: 20, Remaining: 20, ResetAfter: time.Hour, MaxConcurrency: 64})
	time.Sleep(5 * testRetry)
	if g := r.snapshot(); len(g) != 3 {
		t.Fatalf("%d grants, want 3 (15 used of 20, reserve 2)", len(g))
	}
	if got := counterUsed(t, srv.Client()); got != "18" {
		t.Errorf("counter %s, want 18", got)
	}
	if w := a.BudgetWait(false); w.After(time.Now().Add(time.Hour)) || w.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("BudgetWait = %v, want the answer's reset, an hour from now", w)
	}
}

// A cancelled request is never granted; the ones behind it are.
func TestCancelNeverGranted(t *testing.T) {
	srv := etcdtest.Start(t)
	a := newPacer(t, srv.Client(), "a", 1, nil)
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	cancel1 := r.request(a, "a", 1, false)
	r.request(a, "a", 2, false)
	cancel3 := r.request(a, "a", 3, false)
	cancel1()
	cancel3()
	g := r.waitN(t, 2, 30*time.Second)
	time.Sleep(testTTL + expirySlack)
	g = r.snapshot()
	if len(g) != 2 || g[1].shard != 2 {
		t.Fatalf("grants %v, want shard 0 then 2", g)
	}
	if a.Waiting() != 0 {
		t.Errorf("waiting %d, want 0", a.Waiting())
	}
}

// A node that crashes holding the bucket key (its client closed, nothing
// revoked) delays the other by at most the key's TTL: the key is on a
// lease of testTTL that nobody keeps alive, so etcd deletes it when that
// runs out, and the other node is granted once etcd has. How soon after
// etcd expires a lease on a loaded machine is etcd's timing, not the
// pacer's (4.9 s once, for a lease of 2 s), so the test checks the lease
// and that b waited for the key to go, and logs the gap.
func TestCrashedHolderDelaysAtMostTTL(t *testing.T) {
	srv := etcdtest.Start(t)
	ca := srv.Client()
	a := newPacer(t, ca, "a", 1, nil)
	b := newPacer(t, srv.Client(), "b", 1, nil)
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	check := srv.Client()
	key, err := check.Get(etcdtest.Ctx(t, 5*time.Second), prefix+"identify/0")
	if err != nil || len(key.Kvs) != 1 {
		t.Fatalf("the bucket key after a's grant: %v, %v; want it held", key, err)
	}
	ttl, err := check.TimeToLive(etcdtest.Ctx(t, 5*time.Second), clientv3.LeaseID(key.Kvs[0].Lease))
	if err != nil || time.Duration(ttl.GrantedTTL)*time.Second != testTTL {
		t.Fatalf("the bucket key's lease: %+v, %v; want a TTL of %v", ttl, err, testTTL)
	}
	ca.Close()
	r.request(b, "b", 1, false)
	g := r.waitN(t, 2, 30*time.Second)
	gap := g[1].at.Sub(g[0].at)
	if gap < testWindow {
		t.Errorf("b granted %v after the crashed a, want at least %v", gap, testWindow)
	}
	if left, err := check.TimeToLive(etcdtest.Ctx(t, 5*time.Second), clientv3.LeaseID(key.Kvs[0].Lease)); err != nil || left.TTL != -1 {
		t.Errorf("b was granted while a's key lease had %v s left (%v); want it expired", left.TTL, err)
	}
	t.Logf("gap after the crash %v (the key's lease %v)", gap, testTTL)
}

// With etcd down, a request waits, the log says why, and nothing is
// granted; Close still returns.
func TestServerDownNeverGrants(t *testing.T) {
	srv := etcdtest.Start(t)
	var log logBuf
	a := newPacer(t, srv.Client(), "a", 1, &log)
	srv.Stop()
	r := newRecorder()
	if now, _ := a.Request(0, true, r.fn("a", 0)); now {
		t.Fatal("granted at once with etcd down")
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), "identify: read /shardfs/bot/identify/0") {
		if time.Now().After(deadline) {
			t.Fatalf("no error logged within 30s; log:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := r.snapshot(); len(g) != 0 {
		t.Errorf("granted %v with etcd down", g)
	}
	a.Close()
	t.Logf("log: %s", strings.SplitN(log.String(), "\n", 2)[0])
}

// A counter key holding garbage stops the slots with a clear line rather
// than counting against nothing.
func TestGarbageCounter(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	if _, err := c.Put(etcdtest.Ctx(t, 5*time.Second), prefix+"identify/starts", "lots"); err != nil {
		t.Fatal(err)
	}
	var log logBuf
	a := newPacer(t, c, "a", 1, &log)
	r := newRecorder()
	r.request(a, "a", 0, false)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), `holds \"lots\"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no error logged within 30s; log:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := r.snapshot(); len(g) != 0 {
		t.Errorf("granted %v with a garbage counter", g)
	}
	if _, err := c.Delete(etcdtest.Ctx(t, 5*time.Second), prefix+"identify/starts"); err != nil {
		t.Fatal(err)
	}
	r.waitN(t, 1, 30*time.Second)
}

func TestConfigRefused(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Client: &clientv3.Client{}, Prefix: "nofolder"},
		{Client: &clientv3.Client{}, Prefix: prefix, KeyTTL: time.Second},
		{Client: &clientv3.Client{}, Prefix: prefix, KeyTTL: 2 * time.Second, Hold: 2 * time.Second},
	} {
		if p, err := New(cfg); err == nil {
			p.Close()
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// The watch wakes a waiting node when the bucket key expires: with the
// retry timer 30 s away, the slot still comes well before it (within the
// key's TTL on an idle machine; a loaded one may lose a slot after its
// hold and wait for that key too).
func TestWatchWakes(t *testing.T) {
	srv := etcdtest.Start(t)
	mk := func(node string) *Pacer {
		p, err := New(Config{Client: srv.Client(), Prefix: prefix, Node: node, MaxConcurrency: 1, KeyTTL: testTTL, Hold: testHold, Retry: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	a, b := mk("a"), mk("b")
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	r.request(b, "b", 1, false)
	g := r.waitN(t, 2, 20*time.Second)
	if gap := g[1].at.Sub(g[0].at); gap > 15*time.Second {
		t.Errorf("b granted %v after a, want within 15s (the watch, not the 30 s retry)", gap)
	}
}

// A slot acquired for a request cancelled meanwhile is kept for the hold
// (injected clock) and answers the next request of its bucket at once;
// after the hold it is lost and the next request waits for the key's end.
func TestHeldSlot(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	fake := clock.NewFake()
	a, err := New(Config{Client: c, Prefix: prefix, Node: "a", MaxConcurrency: 1, KeyTTL: testTTL, Hold: testHold, Retry: testRetry, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r := newRecorder()
	// The first and third create transactions (shards 0 and 7) find
	// their request cancelled, the second (shard 6) does not.
	cancel0, cancel7 := make(chan func(), 1), make(chan func(), 1)
	var txns atomic.Int32
	a.beforeTxn = func() {
		switch txns.Add(1) {
		case 1:
			(<-cancel0)()
		case 3:
			(<-cancel7)()
		}
	}
	cancel0 <- r.request(a, "a", 0, false)
	key := prefix + "identify/0"
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, err := c.Get(etcdtest.Ctx(t, 5*time.Second), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) == 1 {
			if v := string(g.Kvs[0].Value); v != "a" {
				t.Fatalf("%s = %q, want the node's name", key, v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not created within 30s", key)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The key is written by the transaction before the pacer keeps the
	// slot: wait for the worker to let go of it.
	for a.held(0).IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("slot not held within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if now, _ := a.Request(5, false, r.fn("a", 5)); !now {
		t.Fatal("request within the hold not granted at once")
	}
	if g := r.snapshot(); len(g) != 0 {
		t.Fatalf("cancelled request granted: %v", g)
	}
	if now, _ := a.Request(6, false, r.fn("a", 6)); now {
		t.Fatal("the held slot granted twice")
	}
	r.waitN(t, 1, testTTL+expirySlack+2*time.Second)
	// Hold one more, then let the fake clock pass the hold.
	cancel7 <- r.request(a, "a", 7, false)
	for a.held(0).IsZero() {
		if time.Now().After(deadline.Add(testTTL + expirySlack)) {
			t.Fatal("second slot not held")
		}
		time.Sleep(5 * time.Millisecond)
	}
	fake.Advance(testHold)
	if now, _ := a.Request(8, false, r.fn("a", 8)); now {
		t.Fatal("a slot granted after its hold")
	}
	if g := r.snapshot(); len(g) != 1 || g[0].shard != 6 {
		t.Fatalf("grants %v, want shard 6 only", g)
	}
	r.waitN(t, 2, 2*(testTTL+expirySlack)+2*time.Second)
}

// faults makes a client's calls fail: every unary call (mode 1), or only
// the create transaction's answer, after etcd committed it (mode 2).
type faults struct{ mode atomic.Int32 }

var errInjected = errors.New("injected fault")

func (f *faults) dial() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch f.mode.Load() {
		case 1:
			return status.Error(codes.Unknown, errInjected.Error())
		case 2:
			if tr, ok := req.(*etcdserverpb.TxnRequest); ok && len(tr.Compare) > 0 {
				if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
					return err
				}
				return status.Error(codes.Unknown, "answer lost after the commit")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// Failing calls are logged and retried; no slot is granted without the key
// this node created, not even when the create's answer is lost after etcd
// committed it; the request is granted once etcd answers again.
func TestServerErrorsRetried(t *testing.T) {
	srv := etcdtest.Start(t)
	var f faults
	var log logBuf
	a := newPacer(t, srv.Client(f.dial()), "a", 1, &log)
	r := newRecorder()
	f.mode.Store(1)
	r.request(a, "a", 0, false)
	waitLog(t, &log, "identify: read /shardfs/bot/identify/0: rpc error: code = Unknown desc = injected fault")
	f.mode.Store(2)
	waitLog(t, &log, "identify: create /shardfs/bot/identify/0: rpc error: code = Unknown desc = answer lost after the commit")
	if g := r.snapshot(); len(g) != 0 {
		t.Fatalf("granted %v without an answered create", g)
	}
	f.mode.Store(0)
	g := r.waitN(t, 1, testTTL+expirySlack+10*time.Second)
	if g[0].shard != 0 {
		t.Errorf("granted %v, want shard 0", g)
	}
}

func waitLog(t *testing.T, log *logBuf, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged within 30s; log:\n%s", want, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// aheadClock is the real clock with its wall time ahead by d.
type aheadClock struct{ d time.Duration }

func (c aheadClock) Now() time.Time { return time.Now().Add(c.d) }
func (c aheadClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return time.AfterFunc(d, f)
}

// The daily period is etcd's, not a node's clock (DESIGN 7.3): a node whose
// clock runs 25 h ahead sees the counter another node started as current,
// and the two spend no more than the budget between them (total 10,
// reserve 1). Before, it took the counter for yesterday's, started a new
// period and spent the budget again (18 grants).
func TestSkewedClockCannotRestartPeriod(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	a := newPacer(t, c, "a", 16, nil)
	b, err := New(Config{Client: c, Prefix: prefix, Node: "b", MaxConcurrency: 16, KeyTTL: testTTL, Hold: testHold, Retry: testRetry,
		Clock: aheadClock{25 * time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	for _, p := range []*Pacer{a, b} {
		p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 10, MaxConcurrency: 16})
	}
	r := newRecorder()
	for s := range 5 { // one bucket each: no spacing between them
		r.request(a, "a", s, false)
	}
	r.waitN(t, 5, 30*time.Second) // a starts the period
	for s := 5; s < 16; s++ {
		r.request(b, "b", s, false)
	}
	r.waitN(t, 9, time.Minute)
	// Absence of a grant cannot be waited for: give b a few retries'
	// worth of real time to overspend.
	time.Sleep(5 * testRetry)
	if g := r.snapshot(); len(g) != 9 {
		t.Fatalf("%d automatic grants with one node's clock 25 h ahead, want 9 (total 10, reserve 1)", len(g))
	}
	if got := counterUsed(t, c); got != "9" {
		t.Errorf("counter %s, want 9", got)
	}
	if rb := b.Budget().Remaining; rb != 1 {
		t.Errorf("remaining by the skewed node = %d, want 1", rb)
	}
}

// The total comes from discovery, as core.Pacer's does: Discord's 1000
// only until the first answer (and for good without discovery), capped
// only by Config.Ceiling (--identify-total). Before, a fleet's total was
// capped at 1000 whatever discovery said.
func TestTotalFromDiscovery(t *testing.T) {
	srv := etcdtest.Start(t)
	for _, tc := range []struct {
		name           string
		total, ceiling int
		answers        []int
		want           int
	}{
		{"no discovery", 0, 0, nil, core.DiscordStartTotal},
		{"discovery says more", 0, 0, []int{5000}, 5000},
		{"discovery says less", 0, 0, []int{500}, 500},
		{"discovery follows the latest answer", 0, 0, []int{5000, 2000}, 2000},
		{"--identify-total caps", 2000, 2000, []int{5000}, 2000},
		{"--identify-total above discovery", 9000, 9000, []int{5000}, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Client: srv.Client(), Prefix: prefix, Node: "a", MaxConcurrency: 16, Total: tc.total, Ceiling: tc.ceiling})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for _, n := range tc.answers {
				p.SetStartLimit(core.StartLimit{Total: n, Remaining: n, MaxConcurrency: 16})
			}
			if b := p.Budget(); b.Total != tc.want || b.Remaining != tc.want {
				t.Fatalf("total %d remaining %d, want %d", b.Total, b.Remaining, tc.want)
			}
		})
	}
}

// A slot whose create commits after the hold (injected clock) is lost, and
// its start is given back: the next slot counts 1, not 2. Before, the lost
// slot stayed counted, and under load lost slots spent the budget with no
// grant until the automatic requests stopped for good.
func TestLostSlotGivesItsStartBack(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	fake := clock.NewFake()
	log := &logBuf{}
	a, err := New(Config{Client: c, Prefix: prefix, Node: "a", MaxConcurrency: 1, KeyTTL: testTTL, Hold: testHold, Retry: testRetry,
		Clock: fake, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	a.SetStartLimit(core.StartLimit{Total: 10, Remaining: 10, MaxConcurrency: 1})
	var txns atomic.Int32
	a.beforeTxn = func() {
		if txns.Add(1) == 1 {
			// The create answers after the hold.
			fake.Advance(testHold + time.Millisecond)
		}
	}
	r := newRecorder()
	r.request(a, "a", 0, false)
	// The lost slot's key expires, the watch wakes the worker, and the
	// second create is granted.
	r.waitN(t, 1, 30*time.Second)
	if !strings.Contains(log.String(), "slot acquired after the hold, lost") {
		t.Errorf("no lost slot logged; log:\n%s", log.String())
	}
	if got := counterUsed(t, c); got != "1" {
		t.Errorf("counter %s after one lost slot and one granted, want 1", got)
	}
	if b := a.Budget(); b.Remaining != 9 {
		t.Errorf("budget remaining %d, want 9", b.Remaining)
	}
}

// etcd slower than the hold in real time does not lose a slot the pacer's
// clock still allows. Before, every call of an attempt was cut off at the
// hold in real time: under load the create failed, and with an injected
// clock the retry timer never fired, so the request waited for good.
func TestSlowEtcdWithinTheHold(t *testing.T) {
	srv := etcdtest.Start(t)
	fake := clock.NewFake()
	a, err := New(Config{Client: srv.Client(), Prefix: prefix, Node: "a", MaxConcurrency: 1, KeyTTL: testTTL, Hold: testHold, Retry: testRetry, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	var txns atomic.Int32
	a.beforeTxn = func() {
		if txns.Add(1) == 1 {
			// A loaded machine: the attempt's calls take longer than the
			// hold in real time, not on the pacer's clock.
			time.Sleep(testHold + 200*time.Millisecond)
		}
	}
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	if n := txns.Load(); n != 1 {
		t.Errorf("%d create transactions, want 1", n)
	}
}

// A refund takes one start off the counter of the lost slot's period,
// whatever was counted on top since; another period's counter is left
// alone, and a period the lost slot alone started is deleted.
func TestRefund(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	a := newPacer(t, c, "a", 1, nil)
	ctx := etcdtest.Ctx(t, time.Minute)
	reset := time.Now().Add(time.Hour)
	key := prefix + "identify/starts"
	for _, tc := range []struct {
		name      string
		counter   string
		refundFor time.Time
		want      string // "" = deleted
	}{
		{"counted on top", encodeCounter(5, reset), reset, "4"},
		{"another period", encodeCounter(5, reset.Add(time.Second)), reset, "5"},
		{"the period's only start", encodeCounter(1, reset), reset, ""},
	} {
		if _, err := c.Put(ctx, key, tc.counter); err != nil {
			t.Fatal(err)
		}
		a.refund(tc.refundFor)
		if got := counterUsed(t, c); got != tc.want {
			t.Errorf("%s: refund of %q = %q; want %q", tc.name, tc.counter, got, tc.want)
		}
	}
}

// A granted slot carries its identify-by deadline (core.SlotDeadliner):
// within KeyTTL − 5 s of the slot's start, at least the hold; the core asks
// once, and a slot whose identify did not go out gives its start back.
func TestIdentifyBy(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	fake := clock.NewFake()
	a, err := New(Config{Client: c, Prefix: prefix, Node: "a", MaxConcurrency: 1, KeyTTL: 7 * time.Second, Hold: testHold, Retry: testRetry, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	a.SetStartLimit(core.StartLimit{Total: 10, Remaining: 10, MaxConcurrency: 1})
	if _, _, ok := a.IdentifyBy(0); ok {
		t.Fatal("IdentifyBy(0) before any grant: ok; want none")
	}
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	by, unused, ok := a.IdentifyBy(0)
	if want := clock.Mono(fake) + 2*time.Second; !ok || by != want {
		t.Fatalf("IdentifyBy(0) = %v, %v; want %v (KeyTTL 7 s − 5 s from the slot's start), true", by, ok, want)
	}
	if _, _, ok := a.IdentifyBy(0); ok {
		t.Fatal("IdentifyBy(0) asked twice: ok; want the deadline handed out once")
	}
	if got := counterUsed(t, c); got != "1" {
		t.Fatalf("counter %s after the grant, want 1", got)
	}
	ctx := etcdtest.Ctx(t, time.Minute)
	w := c.Watch(ctx, prefix+"identify/starts")
	unused()
	select {
	case ev := <-w:
		if len(ev.Events) == 0 || ev.Events[0].Type != clientv3.EventTypeDelete {
			t.Fatalf("counter after the slot was given back: %v; want deleted (the slot alone started the period)", ev.Events)
		}
	case <-ctx.Done():
		t.Fatal("the counter did not change after the slot was given back")
	}
}

// A bucket is free Discord's 5 s (and ReleaseMargin) after its identify
// was written, not when its key's lease runs out (issue 22: a bucket gave
// one identify per 7.5 s where Discord allows one per 5 s). The key's
// lease here is a minute, so only Written can free the bucket within the
// test: shard 1 waits while the fake clock stands 5 s after shard 0's
// write, and is granted once it passes 5 s + ReleaseMargin. A write
// reported for a shard holding no slot releases nothing.
func TestWrittenFreesBucket(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client()
	fake := clock.NewFake()
	a, err := New(Config{Client: c, Prefix: prefix, Node: "a", MaxConcurrency: 1, KeyTTL: time.Minute, Hold: testHold, Retry: testRetry, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	r := newRecorder()
	r.request(a, "a", 0, false)
	r.waitN(t, 1, 30*time.Second)
	a.Written(7, fake.Now()) // no slot: nothing to release
	a.Written(0, fake.Now())
	r.request(a, "a", 1, false)
	fake.Advance(core.DiscordWindow)
	if got, err := c.Get(etcdtest.Ctx(t, 5*time.Second), prefix+"identify/0"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("bucket key 5 s after the write: %v, %v; want still held (the release comes ReleaseMargin later)", got, err)
	}
	if g := r.snapshot(); len(g) != 1 {
		t.Fatalf("grants 5 s after shard 0's write: %v; want shard 0's alone", g)
	}
	fake.Advance(ReleaseMargin)
	g := r.waitN(t, 2, 30*time.Second)
	if g[1].shard != 1 {
		t.Fatalf("second grant %+v; want shard 1", g[1])
	}
}
