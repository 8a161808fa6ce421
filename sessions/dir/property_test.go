package dir

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/core"
)

func genSnapshot(t *rapid.T, label string) core.Snapshot {
	return core.Snapshot{
		Flavor:   rapid.SampledFrom([]core.Flavor{core.Discord, core.Fluxer}).Draw(t, label+" flavor"),
		Session:  core.Session{ID: rapid.SampledFrom([]string{secret, "", "a", "é\"\\\n"}).Draw(t, label+" id"), ResumeURL: rapid.String().Draw(t, label+" url")},
		Sequence: rapid.Int64Min(0).Draw(t, label+" sequence"),
		Total:    rapid.IntRange(0, 1<<20).Draw(t, label+" total"),
		SavedAt:  time.UnixMilli(rapid.Int64Range(0, 1<<50).Draw(t, label+" saved_at")),
	}
}

// TestStoreKeepsTheLastSave runs saves, marks-used, reopens and crash
// leftovers against a map: every Load returns the last snapshot saved.
func TestStoreKeepsTheLastSave(t *testing.T) {
	top := t.TempDir()
	rapid.Check(t, func(rt *rapid.T) {
		path, err := os.MkdirTemp(top, "")
		if err != nil {
			rt.Fatal(err)
		}
		path = filepath.Join(path, "sessions")
		s, err := Open(path, Options{})
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { s.Close() }()
		ctx := context.Background()
		model := map[int]core.Snapshot{}
		shard := rapid.IntRange(0, 3)
		rt.Repeat(map[string]func(*rapid.T){
			"save": func(rt *rapid.T) {
				n, snap := shard.Draw(rt, "shard"), genSnapshot(rt, "snap")
				if err := s.Save(ctx, n, snap); err != nil {
					rt.Fatalf("Save(%d): %v", n, err)
				}
				model[n] = snap
			},
			"mark used": func(rt *rapid.T) {
				n := shard.Draw(rt, "shard")
				snap, ok := model[n]
				if !ok {
					rt.Skip("nothing to mark")
				}
				snap.Session.ID = ""
				if err := s.Save(ctx, n, snap); err != nil {
					rt.Fatalf("Save(%d) marking used: %v", n, err)
				}
				model[n] = snap
			},
			"crash leftover": func(rt *rapid.T) {
				n := shard.Draw(rt, "shard")
				name := "." + name(n) + tmpMark + rapid.StringMatching(`[0-9a-f]{16}`).Draw(rt, "suffix")
				if err := os.WriteFile(filepath.Join(path, name), []byte(`{"flavor":`), 0o600); err != nil {
					rt.Fatal(err)
				}
			},
			"reopen": func(rt *rapid.T) {
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				if s, err = Open(path, Options{}); err != nil {
					rt.Fatal(err)
				}
			},
			"": func(rt *rapid.T) {
				for n := range 4 {
					got, ok, err := s.Load(ctx, n)
					want, wantOK := model[n]
					if err != nil || ok != wantOK || ok && !equal(got, want) {
						rt.Fatalf("Load(%d) = %+v (id %q), %v, %v; want %+v (id %q), %v", n, got, got.Session.ID, ok, err, want, want.Session.ID, wantOK)
					}
					if ok && got.Used() != (want.Session.ID == "") {
						rt.Fatalf("Load(%d).Used() = %v; want %v", n, got.Used(), want.Session.ID == "")
					}
				}
			},
		})
	})
}
