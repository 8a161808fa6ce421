package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	leaseetcd "github.com/shardfs/shardfs/lease/etcd"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
	"github.com/shardfs/shardfs/sessions"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secret is the session id of every test snapshot: no error may show it.
const secret = "sess-3f9a1c77e2b04d5e"

var plan = leaseetcd.Plan{Flavor: "discord", Total: 16}

func snapshot(id string) core.Snapshot {
	return core.Snapshot{
		Flavor:   core.Discord,
		Session:  core.Session{ID: id, ResumeURL: "wss://gateway-us-east1-b.discord.gg"},
		Sequence: 4242,
		Total:    16,
		SavedAt:  time.UnixMilli(1_795_000_000_123),
	}
}

// node is one member of bot "b" with the store the wiring would build for
// it: the generations it holds are the test's to set, as the ownership
// layer's would be.
type node struct {
	m     *leaseetcd.Member
	store *Store

	mu   sync.Mutex
	gens map[int]int64
}

// join joins name on a fake clock that never moves, so the member never
// renews: the tests end well within etcd's default TTL of 10 s.
func join(t *testing.T, cli *clientv3.Client, name string) *node {
	t.Helper()
	m, err := leaseetcd.Join(etcdtest.Ctx(t, 10*time.Second), leaseetcd.Config{
		Client: cli, Bot: "b", Node: name, Plan: plan, Clock: clock.NewFake(),
		Logger: slog.New(slog.NewTextHandler(tlog{t}, nil)),
	})
	if err != nil {
		t.Fatalf("Join(%s): %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	n := &node{m: m, gens: map[int]int64{}}
	n.store, err = New(Config{KV: cli, Guard: m, Generation: n.gen})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return n
}

// tlog writes a member's log lines to t.Log.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (n *node) gen(shard int) (int64, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	g, ok := n.gens[shard]
	return g, ok
}

func (n *node) set(shard int, g int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gens[shard] = g
}

func (n *node) drop(shard int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.gens, shard)
}

func (n *node) acquire(t *testing.T, ctx context.Context, shard int) int64 {
	t.Helper()
	g, err := n.m.Acquire(ctx, shard)
	if err != nil {
		t.Fatalf("Acquire(%d): %v", shard, err)
	}
	n.set(shard, g)
	return g
}

func sessionKey(shard int) string { return fmt.Sprintf("%ssessions/%d", leaseetcd.Prefix("b"), shard) }

// stored returns the raw value of shard's snapshot key and its mod
// revision (0, nil when absent).
func stored(t *testing.T, ctx context.Context, cli *clientv3.Client, shard int) ([]byte, int64) {
	t.Helper()
	r, err := cli.Get(ctx, sessionKey(shard))
	if err != nil {
		t.Fatalf("Get %s: %v", sessionKey(shard), err)
	}
	if len(r.Kvs) == 0 {
		return nil, 0
	}
	return r.Kvs[0].Value, r.Kvs[0].ModRevision
}

func encode(t *testing.T, s core.Snapshot) []byte {
	t.Helper()
	b, err := sessions.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func noSecret(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("%s: error shows the session id: %v", what, err)
	}
}

func same(a, b core.Snapshot) bool {
	return a.Flavor == b.Flavor && a.Session == b.Session && a.Sequence == b.Sequence &&
		a.Total == b.Total && a.SavedAt.Equal(b.SavedAt)
}

func TestRoundTrip(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a := join(t, cli, "a")
	a.acquire(t, ctx, 1)

	if got, ok, err := a.store.Load(ctx, 1); err != nil || ok {
		t.Fatalf("Load(1) of nothing = %+v, %v, %v; want false, nil", got, ok, err)
	}
	want := snapshot(secret)
	if err := a.store.Save(ctx, 1, want); err != nil {
		t.Fatalf("Save(1): %v", err)
	}
	if v, _ := stored(t, ctx, cli, 1); string(v) != string(encode(t, want)) {
		t.Fatalf("%s = %q; want sessions.Encode's %q", sessionKey(1), v, encode(t, want))
	}
	got, ok, err := a.store.Load(ctx, 1)
	if err != nil || !ok || !same(got, want) {
		t.Fatalf("Load(1) = %+v, %v, %v; want %+v, true, nil", got, ok, err, want)
	}
	// Another shard's key is not this one's.
	if got, ok, err := a.store.Load(ctx, 2); err != nil || ok {
		t.Fatalf("Load(2) = %+v, %v, %v; want false, nil", got, ok, err)
	}

	used := want
	used.Session.ID = ""
	if err := a.store.Save(ctx, 1, used); err != nil {
		t.Fatalf("Save(1) marking used: %v", err)
	}
	got, ok, err = a.store.Load(ctx, 1)
	if err != nil || !ok || !got.Used() || !same(got, used) {
		t.Fatalf("Load(1) after the mark = %+v, %v, %v; want %+v (used)", got, ok, err, used)
	}
}

// TestSaveStaleGeneration: node a still believes it holds shard 1 at its
// old generation after the key was released and re-created by node b. Its
// Save is refused, names the shard and both generations, and leaves b's
// snapshot as it was.
func TestSaveStaleGeneration(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, b := join(t, cli, "a"), join(t, cli, "b")
	g1 := a.acquire(t, ctx, 1)
	if err := a.m.Release(ctx, 1, g1); err != nil {
		t.Fatal(err)
	}
	g2 := b.acquire(t, ctx, 1)
	bs := snapshot(secret)
	bs.Sequence = 7
	if err := b.store.Save(ctx, 1, bs); err != nil {
		t.Fatalf("b.Save(1): %v", err)
	}
	before, rev := stored(t, ctx, cli, 1)

	err := a.store.Save(ctx, 1, snapshot(secret))
	if !errors.Is(err, leaseetcd.ErrGeneration) {
		t.Fatalf("a.Save(1) at stale generation %d = %v; want ErrGeneration", g1, err)
	}
	for _, s := range []string{"shard 1", fmt.Sprint(g1), fmt.Sprint(g2), "nothing written"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("a.Save(1) error %q does not say %q", err, s)
		}
	}
	noSecret(t, "a.Save(1)", err)
	t.Logf("a's stale Save: %v", err)
	if after, rev2 := stored(t, ctx, cli, 1); string(after) != string(before) || rev2 != rev {
		t.Fatalf("after a's refused Save: %q at revision %d; want b's %q at %d", after, rev2, before, rev)
	}
}

// TestHandoverOldOwnerMarkUsed: a planned move from a to b. b loads a's
// snapshot and marks it used; a's mark-used or write-back afterwards,
// whether a still believes it owns the shard, forgot it, or was fenced
// (its membership closed), is refused and changes nothing.
func TestHandoverOldOwnerMarkUsed(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, b := join(t, cli, "a"), join(t, cli, "b")
	g1 := a.acquire(t, ctx, 3)
	saved := snapshot(secret)
	if err := a.store.Save(ctx, 3, saved); err != nil {
		t.Fatalf("a.Save(3) on the clean stop: %v", err)
	}
	if err := a.m.Release(ctx, 3, g1); err != nil {
		t.Fatal(err)
	}
	b.acquire(t, ctx, 3)
	got, ok, err := b.store.Load(ctx, 3)
	if err != nil || !ok || !same(got, saved) {
		t.Fatalf("b.Load(3) = %+v, %v, %v; want a's snapshot", got, ok, err)
	}
	used := got
	used.Session.ID = ""
	if err := b.store.Save(ctx, 3, used); err != nil {
		t.Fatalf("b's mark-used: %v", err)
	}
	want, rev := stored(t, ctx, cli, 3)

	check := func(what string, err error, sentinel error) {
		t.Helper()
		if !errors.Is(err, sentinel) {
			t.Errorf("%s = %v; want %v", what, err, sentinel)
		}
		if err != nil && !strings.Contains(err.Error(), "shard 3") {
			t.Errorf("%s error %q does not name shard 3", what, err)
		}
		noSecret(t, what, err)
		if v, r := stored(t, ctx, cli, 3); string(v) != string(want) || r != rev {
			t.Fatalf("after %s: %q at revision %d; want b's used copy %q at %d", what, v, r, want, rev)
		}
	}
	check("a's mark-used at its old generation", a.store.Save(ctx, 3, used), leaseetcd.ErrGeneration)
	check("a's write-back at its old generation", a.store.Save(ctx, 3, saved), leaseetcd.ErrGeneration)
	a.drop(3)
	check("a's mark-used once it dropped the shard", a.store.Save(ctx, 3, used), ErrNotOwned)
	a.set(3, g1)
	if err := a.m.Close(); err != nil {
		t.Fatal(err)
	}
	check("a's write-back after its membership closed", a.store.Save(ctx, 3, saved), leaseetcd.ErrClosed)

	got, ok, err = b.store.Load(ctx, 3)
	if err != nil || !ok || !got.Used() {
		t.Fatalf("b.Load(3) at the end = %+v, %v, %v; want the used copy", got, ok, err)
	}
}

// TestSaveNotOwned: a Save for a shard the ownership layer says this node
// does not hold makes no request and writes nothing.
func TestSaveNotOwned(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a := join(t, cli, "a")
	err := a.store.Save(ctx, 5, snapshot(secret))
	if !errors.Is(err, ErrNotOwned) || !strings.Contains(err.Error(), "shard 5") {
		t.Fatalf("Save(5) of a shard not owned = %v; want ErrNotOwned naming shard 5", err)
	}
	noSecret(t, "Save(5)", err)
	if v, _ := stored(t, ctx, cli, 5); v != nil {
		t.Fatalf("Save(5) of a shard not owned wrote %q", v)
	}
}

func TestLoadMalformed(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a := join(t, cli, "a")
	for i, v := range []string{
		"",
		"garbage",
		`{"flavor":"discord","session_id":"` + secret + `"`,
		`{"flavor":"discord","session_id":"` + secret + `","sequence":1,"resume_url":"","total":16,"saved_at":1,"x":1}`,
		strings.Repeat(" ", sessions.MaxSize+1),
	} {
		if _, err := cli.Put(ctx, sessionKey(1), v); err != nil {
			t.Fatal(err)
		}
		got, ok, err := a.store.Load(ctx, 1)
		if !errors.Is(err, sessions.ErrMalformed) || ok {
			t.Errorf("case %d: Load(1) = %+v, %v, %v; want ErrMalformed", i, got, ok, err)
		}
		if err != nil && !strings.Contains(err.Error(), "shard 1") {
			t.Errorf("case %d: Load(1) error %q does not name shard 1", i, err)
		}
		noSecret(t, fmt.Sprintf("case %d: Load(1)", i), err)
	}
}

func TestServerDown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a := join(t, cli, "a")
	a.acquire(t, etcdtest.Ctx(t, 10*time.Second), 1)
	srv.Stop()

	short := func() context.Context { return etcdtest.Ctx(t, 500*time.Millisecond) }
	_, ok, err := a.store.Load(short(), 1)
	if err == nil || ok || errors.Is(err, sessions.ErrMalformed) || !strings.Contains(err.Error(), "load shard 1") {
		t.Fatalf("Load(1) with etcd down = %v, %v; want a transport error naming the call", ok, err)
	}
	t.Logf("Load with etcd down: %v", err)
	err = a.store.Save(short(), 1, snapshot(secret))
	if err == nil || errors.Is(err, leaseetcd.ErrGeneration) || !strings.Contains(err.Error(), "save shard 1") {
		t.Fatalf("Save(1) with etcd down = %v; want a transport error naming the call", err)
	}
	noSecret(t, "Save(1) with etcd down", err)
	t.Logf("Save with etcd down: %v", err)
}

// TestCancelled: a cancelled context ends Load and Save at once, before a
// request (nothing written) and during one (etcd down, no deadline: only
// the cancel ends it).
func TestCancelled(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a := join(t, cli, "a")
	a.acquire(t, ctx, 1)

	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := a.store.Load(done, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with a cancelled context = %v; want context.Canceled", err)
	}
	if err := a.store.Save(done, 1, snapshot(secret)); !errors.Is(err, context.Canceled) {
		t.Errorf("Save with a cancelled context = %v; want context.Canceled", err)
	}
	if v, _ := stored(t, ctx, cli, 1); v != nil {
		t.Fatalf("Save with a cancelled context wrote %q", v)
	}

	srv.Stop()
	for _, call := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"Load", func(ctx context.Context) error { _, _, err := a.store.Load(ctx, 1); return err }},
		{"Save", func(ctx context.Context) error { return a.store.Save(ctx, 1, snapshot(secret)) }},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- call.f(ctx) }()
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s cancelled with etcd down = %v; want context.Canceled", call.name, err)
			}
			noSecret(t, call.name, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s cancelled with etcd down did not return within 5s", call.name)
		}
	}
}

func TestNewChecksConfig(t *testing.T) {
	gen := func(int) (int64, bool) { return 0, false }
	kv := clientv3.NewKVFromKVClient(nil, nil)
	m := fakeGuard("/shardfs/b/")
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"no KV", Config{Guard: m, Generation: gen}},
		{"no Guard", Config{KV: kv, Generation: gen}},
		{"no Generation", Config{KV: kv, Guard: m}},
		{"prefix without '/'", Config{KV: kv, Guard: fakeGuard("/shardfs/b"), Generation: gen}},
	} {
		if s, err := New(c.cfg); err == nil {
			t.Errorf("New(%s) = %v, nil; want an error", c.name, s)
		}
	}
	if _, err := New(Config{KV: kv, Guard: m, Generation: gen}); err != nil {
		t.Errorf("New of a whole config = %v", err)
	}
}

// fakeGuard is a Guard that only has a prefix.
type fakeGuard string

func (g fakeGuard) Prefix() string { return string(g) }

func (fakeGuard) Guarded(context.Context, int, int64, ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return nil, errors.New("fakeGuard: no etcd")
}

// TestSaveAfterExpiry is the paused node: etcd expired a's lease (revoked
// here, which deletes its keys the same way) while a, not renewing, still
// believes it holds shard 2. Neither in the gap before another node takes
// the shard nor after b did may a write; b's used copy stays used.
func TestSaveAfterExpiry(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a, b := join(t, cli, "a"), join(t, cli, "b")
	g1 := a.acquire(t, ctx, 2)
	saved := snapshot(secret)
	if err := a.store.Save(ctx, 2, saved); err != nil {
		t.Fatalf("a.Save(2): %v", err)
	}
	if _, err := cli.Revoke(ctx, a.m.LeaseID()); err != nil {
		t.Fatal(err)
	}
	if a.m.Err() != nil {
		t.Fatalf("a's membership ended (%v); the test needs a node that has not noticed", a.m.Err())
	}
	want, rev := stored(t, ctx, cli, 2)
	used := saved
	used.Session.ID = ""
	err := a.store.Save(ctx, 2, used)
	if !errors.Is(err, leaseetcd.ErrGeneration) || !strings.Contains(err.Error(), fmt.Sprint(g1)) || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("a.Save(2) with its key expired = %v; want ErrGeneration naming generation %d and the absent key", err, g1)
	}
	noSecret(t, "a.Save(2) with its key expired", err)
	if v, r := stored(t, ctx, cli, 2); string(v) != string(want) || r != rev {
		t.Fatalf("a's refused Save changed %s: %q at %d; want %q at %d", sessionKey(2), v, r, want, rev)
	}

	b.acquire(t, ctx, 2)
	got, ok, err := b.store.Load(ctx, 2)
	if err != nil || !ok || !same(got, saved) {
		t.Fatalf("b.Load(2) = %+v, %v, %v; want a's snapshot", got, ok, err)
	}
	if err := b.store.Save(ctx, 2, used); err != nil {
		t.Fatalf("b's mark-used: %v", err)
	}
	if err := a.store.Save(ctx, 2, saved); !errors.Is(err, leaseetcd.ErrGeneration) {
		t.Fatalf("a's write-back after b took shard 2 = %v; want ErrGeneration", err)
	}
	if got, ok, err := b.store.Load(ctx, 2); err != nil || !ok || !got.Used() {
		t.Fatalf("b.Load(2) at the end = %+v, %v, %v; want the used copy", got, ok, err)
	}
}

// TestConcurrentShards saves and loads 16 shards at once, as the core does
// on a start and a shutdown; each shard reads back its own snapshot.
func TestConcurrentShards(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 20*time.Second)
	a := join(t, cli, "a")
	for id := 0; id < plan.Total; id++ {
		a.acquire(t, ctx, id)
	}
	snap := func(id int) core.Snapshot {
		s := snapshot(fmt.Sprintf("%s-%d", secret, id))
		s.Sequence = int64(100 + id)
		return s
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*plan.Total)
	for id := 0; id < plan.Total; id++ {
		wg.Go(func() {
			if err := a.store.Save(ctx, id, snap(id)); err != nil {
				errs <- fmt.Errorf("Save(%d): %v", id, err)
				return
			}
			got, ok, err := a.store.Load(ctx, id)
			if err != nil || !ok || !same(got, snap(id)) {
				errs <- fmt.Errorf("Load(%d) = %+v, %v, %v; want %+v", id, got, ok, err, snap(id))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
