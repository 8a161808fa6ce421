package supervisor

import (
	"log/slog"
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
