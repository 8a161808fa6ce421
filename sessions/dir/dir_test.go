package dir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/sessions"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	goleak.VerifyTestMain(m)
}

// secret stands in for a session id; no error or log line may show it.
const secret = "0123456789abcdef0123456789abcdef"

// nobody is the user that files "owned by someone else" belong to.
const nobody = 65534

func snap(seq int64) core.Snapshot {
	return core.Snapshot{
		Flavor:   core.Discord,
		Session:  core.Session{ID: secret, ResumeURL: "wss://resume.example"},
		Sequence: seq,
		Total:    4,
		SavedAt:  time.UnixMilli(1_796_000_000_000 + seq),
	}
}

func equal(a, b core.Snapshot) bool {
	return a.Flavor == b.Flavor && a.Session.ID == b.Session.ID && a.Session.ResumeURL == b.Session.ResumeURL &&
		a.Sequence == b.Sequence && a.Total == b.Total && a.SavedAt.Equal(b.SavedAt)
}

// logBuf is a logger whose lines a test can count.
type logBuf struct{ bytes.Buffer }

func (l *logBuf) logger() *slog.Logger { return slog.New(slog.NewTextHandler(&l.Buffer, nil)) }

func open(t testing.TB, path string, log *slog.Logger) *Store {
	t.Helper()
	s, err := Open(path, Options{Logger: log})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	s := open(t, path, nil)
	ctx := context.Background()
	if _, ok, err := s.Load(ctx, 3); ok || err != nil {
		t.Fatalf("Load(3) of a new folder = ok %v, %v; want nothing, no error", ok, err)
	}
	if err := s.Save(ctx, 3, snap(7)); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load(ctx, 3)
	if !ok || err != nil || !equal(got, snap(7)) {
		t.Fatalf("Load(3) = %+v, %v, %v; want %+v", got, ok, err, snap(7))
	}
	if got.Session.ID != secret {
		t.Fatalf("Load(3) lost the session id")
	}
	if m := mode(t, path); m != 0o700 {
		t.Errorf("folder mode = %04o; want 0700", m)
	}
	if m := mode(t, filepath.Join(path, "shard-3.json")); m != 0o600 {
		t.Errorf("shard-3.json mode = %04o; want 0600", m)
	}
	b, err := os.ReadFile(filepath.Join(path, "shard-3.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := sessions.Encode(snap(7))
	if !bytes.Equal(b, want) {
		t.Errorf("shard-3.json = %s; want %s", b, want)
	}
	used := snap(7)
	used.Session.ID = ""
	if err := s.Save(ctx, 3, used); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := s.Load(ctx, 3); !ok || err != nil || !got.Used() || !equal(got, used) {
		t.Fatalf("Load(3) after marking it used = %+v, %v, %v; want %+v", got, ok, err, used)
	}
	if names := entries(t, path); strings.Join(names, " ") != "lock shard-3.json" {
		t.Errorf("folder holds %q; want only lock and shard-3.json", names)
	}
}

func entries(t *testing.T, path string) []string {
	t.Helper()
	es, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestOpen(t *testing.T) {
	root := os.Geteuid() == 0
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, path string)
		asRoot   bool // the case needs root to set up
		want     string
		wantMode os.FileMode // of the folder after a successful Open
		wantWarn bool
	}{
		{name: "absent: created", setup: func(*testing.T, string) {}, wantMode: 0o700},
		{name: "absent with absent parents: created", setup: func(t *testing.T, path string) {
			if err := os.Remove(filepath.Dir(path)); err != nil {
				t.Fatal(err)
			}
		}, wantMode: 0o700},
		{name: "0700 kept", setup: mkdir(0o700), wantMode: 0o700},
		{name: "0755 tightened", setup: mkdir(0o755), wantMode: 0o700, wantWarn: true},
		{name: "0750 tightened", setup: mkdir(0o750), wantMode: 0o700, wantWarn: true},
		{name: "0500 kept (read-only is the operator's choice)", setup: mkdir(0o500), wantMode: 0o500},
		{name: "group-writable refused", setup: mkdir(0o770), want: "writable by group or others (mode 0770)"},
		{name: "world-writable refused", setup: mkdir(0o1777), want: "writable by group or others"},
		{name: "a file", setup: func(t *testing.T, path string) { write(t, path, "x", 0o600) }, want: "is not a directory"},
		{name: "parent is a file", setup: func(t *testing.T, path string) {
			parent := filepath.Dir(path)
			if err := os.Remove(parent); err != nil {
				t.Fatal(err)
			}
			write(t, parent, "x", 0o600)
		}, want: "not a directory"},
		{name: "owned by another user", asRoot: true, setup: func(t *testing.T, path string) {
			mkdir(0o700)(t, path)
			chown(t, path, nobody)
		}, want: fmt.Sprintf("owned by uid %d", nobody)},
		{name: "lock is a symlink", setup: func(t *testing.T, path string) {
			mkdir(0o700)(t, path)
			write(t, path+".elsewhere", "", 0o600)
			if err := os.Symlink(path+".elsewhere", filepath.Join(path, "lock")); err != nil {
				t.Fatal(err)
			}
		}, want: "lock is a symlink"},
		{name: "lock is a directory", setup: func(t *testing.T, path string) {
			mkdir(0o700)(t, path)
			mkdir(0o700)(t, filepath.Join(path, "lock"))
		}, want: "lock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.asRoot && !root {
				t.Skip("needs root to give a file to another user")
			}
			path := filepath.Join(t.TempDir(), "parent", "sessions")
			if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, path)
			var log logBuf
			s, err := Open(path, Options{Logger: log.logger()})
			if tc.want != "" {
				if err == nil {
					s.Close()
					t.Fatalf("Open() succeeded; want an error saying %q", tc.want)
				}
				if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Open() = %v; want an error naming %s and saying %q", err, path, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open() = %v", err)
			}
			defer s.Close()
			if m := dirMode(t, path); m != tc.wantMode {
				t.Errorf("folder mode after Open = %04o; want %04o", m, tc.wantMode)
			}
			if got := strings.Count(log.String(), "level=WARN"); got != b2i(tc.wantWarn) {
				t.Errorf("Open logged %d warnings; want %d:\n%s", got, b2i(tc.wantWarn), log.String())
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func dirMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	m := fi.Mode()
	return m.Perm() | m&os.ModeSticky
}

func mkdir(m os.FileMode) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		t.Helper()
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, m); err != nil { // past the umask
			t.Fatal(err)
		}
	}
}

func write(t *testing.T, path, content string, m os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), m); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func TestLoadBadInput(t *testing.T) {
	root := os.Geteuid() == 0
	good, err := sessions.Encode(snap(9))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		setup     func(t *testing.T, file string)
		asRoot    bool
		want      string // in the error; empty: no error
		malformed bool   // the error wraps sessions.ErrMalformed
		wantOK    bool
		wantWarn  int
		wantMode  os.FileMode // of the file afterwards, when it is one
	}{
		{name: "absent", setup: func(*testing.T, string) {}},
		{name: "good", setup: func(t *testing.T, f string) { write(t, f, string(good), 0o600) }, wantOK: true, wantMode: 0o600},
		{name: "truncated", setup: func(t *testing.T, f string) { write(t, f, string(good[:len(good)/2]), 0o600) }, want: "truncated", malformed: true, wantMode: 0o600},
		{name: "empty", setup: func(t *testing.T, f string) { write(t, f, "", 0o600) }, want: "empty", malformed: true, wantMode: 0o600},
		{name: "not JSON", setup: func(t *testing.T, f string) { write(t, f, "session "+secret+"\n", 0o600) }, want: "not JSON", malformed: true, wantMode: 0o600},
		{name: "oversized", setup: func(t *testing.T, f string) {
			write(t, f, string(good[:len(good)-2])+strings.Repeat(" ", sessions.MaxSize)+"}", 0o600)
		}, want: "larger than", malformed: true, wantMode: 0o600},
		{name: "a directory", setup: func(t *testing.T, f string) { mkdir(0o700)(t, f) }, want: "is a directory"},
		{name: "a symlink to a good snapshot", setup: func(t *testing.T, f string) {
			other := filepath.Join(t.TempDir(), "elsewhere.json")
			write(t, other, string(good), 0o600)
			if err := os.Symlink(other, f); err != nil {
				t.Fatal(err)
			}
		}, want: "is a symlink; refusing to follow it"},
		{name: "a dangling symlink", setup: func(t *testing.T, f string) {
			if err := os.Symlink("/nonexistent/shard.json", f); err != nil {
				t.Fatal(err)
			}
		}, want: "is a symlink"},
		{name: "a fifo does not block", setup: func(t *testing.T, f string) {
			if err := syscall.Mkfifo(f, 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: "not a regular file"},
		{name: "0644: used, warned, tightened", setup: func(t *testing.T, f string) { write(t, f, string(good), 0o644) }, wantOK: true, wantWarn: 1, wantMode: 0o600},
		{name: "0666: used, warned, tightened", setup: func(t *testing.T, f string) { write(t, f, string(good), 0o666) }, wantOK: true, wantWarn: 1, wantMode: 0o600},
		{name: "owned by another user", asRoot: true, setup: func(t *testing.T, f string) {
			write(t, f, string(good), 0o600)
			chown(t, f, nobody)
		}, want: fmt.Sprintf("is owned by uid %d", nobody), wantMode: 0o600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.asRoot && !root {
				t.Skip("needs root to give a file to another user")
			}
			path := filepath.Join(t.TempDir(), "sessions")
			var log logBuf
			s := open(t, path, log.logger())
			file := filepath.Join(path, "shard-2.json")
			tc.setup(t, file)
			for range 2 { // the second Load shows the warning is given once
				got, ok, err := s.Load(context.Background(), 2)
				if tc.want == "" && err != nil {
					t.Fatalf("Load(2) = %v", err)
				}
				if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file)) {
					t.Fatalf("Load(2) error = %v; want one naming %s and saying %q", err, file, tc.want)
				}
				if err != nil && errors.Is(err, sessions.ErrMalformed) != tc.malformed {
					t.Fatalf("Load(2) error %v: errors.Is(ErrMalformed) = %v; want %v", err, !tc.malformed, tc.malformed)
				}
				if err != nil && strings.Contains(err.Error(), secret) {
					t.Fatalf("Load(2) error shows the session id: %v", err)
				}
				if ok != tc.wantOK || (ok && !equal(got, snap(9))) {
					t.Fatalf("Load(2) = %+v, ok %v; want ok %v", got, ok, tc.wantOK)
				}
			}
			if got := strings.Count(log.String(), "level=WARN"); got != tc.wantWarn {
				t.Errorf("two Loads logged %d warnings; want %d:\n%s", got, tc.wantWarn, log.String())
			}
			if strings.Contains(log.String(), secret) {
				t.Errorf("the log shows the session id:\n%s", log.String())
			}
			if tc.wantMode != 0 {
				if m := mode(t, file); m != tc.wantMode {
					t.Errorf("file mode after Load = %04o; want %04o", m, tc.wantMode)
				}
			}
		})
	}
}

func TestLoadSaveRefuseNegativeShard(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	if _, _, err := s.Load(context.Background(), -1); err == nil {
		t.Error("Load(-1) succeeded")
	}
	if err := s.Save(context.Background(), -1, snap(1)); err == nil {
		t.Error("Save(-1) succeeded")
	}
}

func TestSaveErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *Store, path string)
		snap  core.Snapshot
		want  string
	}{
		{name: "a directory where the file should be", snap: snap(2), setup: func(t *testing.T, _ *Store, path string) {
			mkdir(0o700)(t, filepath.Join(path, "shard-1.json"))
		}, want: "is a directory"},
		{name: "folder removed", snap: snap(2), setup: func(t *testing.T, _ *Store, path string) {
			if err := os.RemoveAll(path); err != nil {
				t.Fatal(err)
			}
		}, want: "cannot create"},
		{name: "a snapshot that cannot be encoded", snap: core.Snapshot{Flavor: core.Discord, Sequence: -1}, setup: func(*testing.T, *Store, string) {}, want: "sequence is negative"},
		{name: "folder not writable", snap: snap(2), setup: func(t *testing.T, _ *Store, path string) {
			if os.Geteuid() == 0 {
				t.Skip("root writes to a 0500 folder; TestSaveUnwritableFolderAsAnotherUser covers root")
			}
			if err := os.Chmod(path, 0o500); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(path, 0o700) })
		}, want: "is not writable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sessions")
			s := open(t, path, nil)
			tc.setup(t, s, path)
			err := s.Save(context.Background(), 1, tc.snap)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Save(1) = %v; want an error saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("Save(1) error shows the session id: %v", err)
			}
			if es, err := os.ReadDir(path); err == nil {
				for _, e := range es {
					if strings.Contains(e.Name(), "tmp") {
						t.Errorf("a failed Save left %s behind", e.Name())
					}
				}
			}
		})
	}
}

func TestSaveReplacesWithoutFollowingASymlink(t *testing.T) {
	path := t.TempDir()
	s := open(t, path, nil)
	other := filepath.Join(t.TempDir(), "elsewhere.json")
	write(t, other, "keep", 0o600)
	if err := os.Symlink(other, filepath.Join(path, "shard-0.json")); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(context.Background(), 0, snap(1)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(other); string(b) != "keep" {
		t.Fatalf("Save wrote through the symlink: %s = %q", other, b)
	}
	if got, ok, err := s.Load(context.Background(), 0); !ok || err != nil || !equal(got, snap(1)) {
		t.Fatalf("Load(0) = %+v, %v, %v; want the saved snapshot", got, ok, err)
	}
}

func TestClosed(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close() = %v", err)
	}
	if _, _, err := s.Load(context.Background(), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Load after Close = %v; want ErrClosed", err)
	}
	if err := s.Save(context.Background(), 0, snap(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Save after Close = %v; want ErrClosed", err)
	}
}
