package dir

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/shardfs/shardfs/core"
)

func TestCallsWithAnEndedContextDoNoIO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s := open(t, path, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Save(ctx, 0, snap(1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Save with a cancelled ctx = %v; want context.Canceled", err)
	}
	if _, ok, err := s.Load(ctx, 0); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("Load with a cancelled ctx = ok %v, %v; want context.Canceled", ok, err)
	}
	if names := entries(t, path); strings.Join(names, " ") != "lock" {
		t.Fatalf("folder holds %q; want only lock", names)
	}
}

// TestSaveReturnsWhenCtxEnds blocks a save's I/O, ends its ctx: Save returns
// at once, the blocked write is abandoned before its rename, a later save
// of the shard lands after it, and nothing partial is left.
func TestSaveReturnsWhenCtxEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Save(context.Background(), 0, snap(1)); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan int, 2), make(chan struct{})
	blocked := 0
	s.beforeRename = func(shard int) {
		entered <- shard
		if shard != 0 {
			return
		}
		blocked++ // saves of one shard run one at a time: no race
		if blocked == 1 {
			<-release
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- s.Save(ctx, 0, snap(2)) }()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Save whose ctx ended while its I/O was blocked = %v; want context.Canceled", err)
	}

	// Another shard is not held up by the blocked one.
	go func() { errc <- s.Save(context.Background(), 1, snap(5)) }()
	if shard := <-entered; shard != 1 {
		t.Fatalf("hook ran for shard %d; want 1", shard)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	go func() { errc <- s.Save(context.Background(), 0, snap(3)) }()
	close(release)
	if shard := <-entered; shard != 0 {
		t.Fatalf("hook ran for shard %d; want 0", shard)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range entries(t, path) {
		if strings.Contains(name, tmpMark) {
			t.Errorf("the abandoned save left %s", name)
		}
	}
	s = open(t, path, nil)
	for shard, want := range map[int]int64{0: 3, 1: 5} {
		if got, ok, err := s.Load(context.Background(), shard); !ok || err != nil || !equal(got, snap(want)) {
			t.Errorf("Load(%d) = %+v, %v, %v; want sequence %d", shard, got, ok, err, want)
		}
	}
}

// TestCloseWaitsForAbandonedIO: the lock must outlive every write, or a
// second process could open the folder while an abandoned save renames.
func TestCloseWaitsForAbandonedIO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan int, 1), make(chan struct{})
	s.beforeRename = func(shard int) {
		entered <- shard
		<-release
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- s.Save(ctx, 0, snap(2)) }()
	<-entered
	cancel()
	<-errc
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	// While Close waits the folder stays locked.
	var inUse *InUseError
	if _, err := Open(path, Options{}); !errors.As(err, &inUse) {
		t.Fatalf("Open while Close waits for a save = %v; want InUseError", err)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s = open(t, path, nil)
	if got, ok, err := s.Load(context.Background(), 0); ok || err != nil {
		t.Fatalf("Load(0) = %+v, ok %v, %v; want nothing: the abandoned save stops before its rename", got, ok, err)
	}
}

// TestSavesOfAShardRunOneAtATime: a save waiting behind another save of its
// shard gives up, without any I/O, when its ctx ends.
func TestSavesOfAShardRunOneAtATime(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan core.Snapshot, 2), make(chan struct{})
	s.beforeRename = func(shard int) {
		entered <- core.Snapshot{}
		<-release
	}
	errc := make(chan error)
	go func() { errc <- s.Save(context.Background(), 0, snap(1)) }()
	<-entered
	ctx := &lateCtx{Context: context.Background(), checked: make(chan struct{}), done: make(chan struct{})}
	go func() { errc <- s.Save(ctx, 0, snap(2)) }()
	<-ctx.checked // past the check on entry: waiting for the shard
	close(ctx.done)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Save waiting behind another = %v; want context.Canceled", err)
	}
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(entered); n != 0 {
		t.Fatalf("the save that gave up wrote a temp file")
	}
	s = open(t, path, nil)
	if got, ok, err := s.Load(context.Background(), 0); !ok || err != nil || !equal(got, snap(1)) {
		t.Fatalf("Load(0) = %+v, %v, %v; want sequence 1", got, ok, err)
	}
}

// TestInterruptedSaveLeavesThePreviousSnapshot is a crash before the
// rename, simulated by the temp file it leaves.
func TestInterruptedSaveLeavesThePreviousSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s := open(t, path, nil)
	if err := s.Save(context.Background(), 0, snap(1)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".shard-0.json" + tmpMark + "0123456789abcdef", ".shard-1.json" + tmpMark + "fedcba9876543210"} {
		write(t, filepath.Join(path, name), `{"flavor":"discord","session_id":"`, 0o600)
	}
	if got, ok, err := s.Load(context.Background(), 0); !ok || err != nil || !equal(got, snap(1)) {
		t.Fatalf("Load(0) beside a stale temp file = %+v, %v, %v; want sequence 1", got, ok, err)
	}
	if _, ok, err := s.Load(context.Background(), 1); ok || err != nil {
		t.Fatalf("Load(1) with only a temp file = ok %v, %v; want nothing", ok, err)
	}
	s.Close()
	var log logBuf
	s = open(t, path, log.logger())
	if names := entries(t, path); strings.Join(names, " ") != "lock shard-0.json" {
		t.Fatalf("folder holds %q after Open; want the temp files gone", names)
	}
	if n := strings.Count(log.String(), "removed the temp file"); n != 2 {
		t.Errorf("Open logged %d removals; want 2:\n%s", n, log.String())
	}
	if got, ok, err := s.Load(context.Background(), 0); !ok || err != nil || !equal(got, snap(1)) {
		t.Fatalf("Load(0) after Open = %+v, %v, %v; want sequence 1", got, ok, err)
	}
}

// lateCtx lets a call pass its check on entry, then ends when done closes.
type lateCtx struct {
	context.Context
	once    sync.Once
	checked chan struct{} // closed by the first Err
	done    chan struct{}
}

func (c *lateCtx) Done() <-chan struct{} { return c.done }

func (c *lateCtx) Err() error {
	first := false
	c.once.Do(func() { first = true; close(c.checked) })
	select {
	case <-c.done:
		if !first {
			return context.Canceled
		}
	default:
	}
	return nil
}
