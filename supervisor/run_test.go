package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/sessions/dir"
)

// TestDropSnapshots: a killed child's snapshots are gone before its next
// start (the file names are sessions/dir's).
func TestDropSnapshots(t *testing.T) {
	folder := t.TempDir()
	store, err := dir.Open(folder, dir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, shard := range []int{3, 4} {
		snap := core.Snapshot{Flavor: core.Discord, Session: core.Session{ID: "s", ResumeURL: "wss://x"}, Sequence: 9, Total: 8, SavedAt: time.Now()}
		if err := store.Save(t.Context(), shard, snap); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	dropSnapshots(folder, []int{3, 4, 5}, slog.New(slog.DiscardHandler))
	store, err = dir.Open(folder, dir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, shard := range []int{3, 4} {
		if _, ok, err := store.Load(t.Context(), shard); ok || err != nil {
			t.Errorf("shard %d: snapshot still there (%v)", shard, err)
		}
	}
}

// TestSessionsInUse: a second supervise on a --sessions folder that one
// holds is refused at once, naming the holder, before it starts anything;
// the folder is free again once the first lets it go.
func TestSessionsInUse(t *testing.T) {
	folder := t.TempDir()
	release, err := lockSessions(folder)
	if err != nil {
		t.Fatal(err)
	}
	err = Run(t.Context(), RunConfig{SessionsDir: folder})
	if !errors.Is(err, ErrSessionsInUse) || !strings.Contains(err.Error(), fmt.Sprintf("(process %d)", os.Getpid())) {
		t.Errorf("Run on a held folder = %v; want ErrSessionsInUse naming process %d", err, os.Getpid())
	}
	release()
	release, err = lockSessions(folder)
	if err != nil {
		t.Fatalf("lockSessions after the release = %v", err)
	}
	release()
}

// warnings sends each warning's message on a channel.
type warnings chan string

func (w warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnings) Handle(_ context.Context, r slog.Record) error {
	w <- r.Message
	return nil
}
func (w warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w warnings) WithGroup(string) slog.Handler      { return w }

// TestWaitChildFolders: a child's sessions folder that a process holds
// (a killed supervise's child, saving) is waited for, and the start goes
// on once it is released; one held past the bound is an error that says
// so, rather than a child that fails on it seconds later.
func TestWaitChildFolders(t *testing.T) {
	folder := t.TempDir()
	a := twoChildren(t)
	store, err := dir.Open(filepath.Join(folder, "b"), dir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	if err := waitChildFolders(t.Context(), folder, a, 100*time.Millisecond, quiet); !errors.Is(err, ErrSessionsInUse) || !strings.Contains(err.Error(), "child b's sessions folder") {
		t.Errorf("waitChildFolders while b's folder is held = %v; want ErrSessionsInUse naming child b", err)
	}
	warned := make(warnings, 1)
	done := make(chan error, 1)
	go func() { done <- waitChildFolders(t.Context(), folder, a, time.Minute, slog.New(warned)) }()
	<-warned // it waits
	store.Close()
	if err := <-done; err != nil {
		t.Errorf("waitChildFolders once b's folder was released = %v; want nil", err)
	}
}

// A child's limit report does not move the tree's pacing when the parent
// discovered the limit itself (N1 of the re-attack on issue 23: a
// max_concurrency of 1 or a remaining of 0 with a day's reset from one
// child set every child's identifies); without the parent's discovery it
// is what the pacer learns.
func TestChildLimitsIgnoredWithOwnDiscovery(t *testing.T) {
	own := core.StartLimit{Total: 1000, Remaining: 990, ResetAfter: time.Hour, MaxConcurrency: 4}
	forged := core.StartLimit{Total: 1000, Remaining: 0, ResetAfter: 24 * time.Hour, MaxConcurrency: 1}
	log := slog.New(slog.DiscardHandler)

	pacer := core.NewDiscordPacer(nil, 1)
	pacer.SetStartLimit(own)
	childLimits(pacer, &own, log)("c1", forged)
	if mc, b := pacer.MaxConcurrency(), pacer.Budget(); mc != 4 || b.Remaining != 990 {
		t.Errorf("with its own discovery: max_concurrency %d, remaining %d; want 4 and 990", mc, b.Remaining)
	}

	blind := core.NewDiscordPacer(nil, 4)
	childLimits(blind, nil, log)("c1", forged)
	if mc, b := blind.MaxConcurrency(), blind.Budget(); mc != 1 || b.Remaining != 0 {
		t.Errorf("without discovery: max_concurrency %d, remaining %d; want the child's 1 and 0", mc, b.Remaining)
	}
}
