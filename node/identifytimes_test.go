package node

import (
	"log/slog"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/sessions/dir"
)

// TestKeptIdentifyTimes: serve --sessions spaces its first identify of a
// bucket from the last one a predecessor wrote (kept beside the
// sessions), and keeps its own writes there for the next process.
func TestKeptIdentifyTimes(t *testing.T) {
	folder := t.TempDir()
	prev := time.Now().Add(-2 * time.Second).Round(0)
	if err := dir.SaveIdentifyTimes(folder, dir.IdentifyTimes{MaxConcurrency: 2, Written: map[int]time.Time{1: prev}}); err != nil {
		t.Fatal(err)
	}
	notBefore, written := keptIdentifyTimes(folder, func() int { return 2 }, slog.New(slog.DiscardHandler))
	if nb := notBefore(0); !nb.IsZero() {
		t.Errorf("notBefore(0) = %v; want none (nobody wrote in its bucket)", nb)
	}
	if nb, want := notBefore(3), prev.Add(core.DiscordWindow+gateway.DefaultIdentifyMargin); !nb.Equal(want) {
		t.Errorf("notBefore(3) = %v; want %v", nb, want)
	}
	at := time.Now().Round(0)
	written(2, at)
	got, err := dir.LoadIdentifyTimes(folder)
	if err != nil || !got.Written[0].Equal(at) || !got.Written[1].Equal(prev) {
		t.Fatalf("saved %+v, %v; want bucket 0 at %v, bucket 1 at %v", got, err, at, prev)
	}
}
