package fsrv

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in, network, address string
	}{
		{"", "tcp", "127.0.0.1:5640"},
		{"tcp!127.0.0.1!564", "tcp", "127.0.0.1:564"},
		{"tcp!*!564", "tcp", ":564"},
		{"tcp![::1]!564", "tcp", "[::1]:564"},
		{"tcp!::1!564", "tcp", "[::1]:564"},
		{"localhost:5640", "tcp", "localhost:5640"},
		{":5640", "tcp", ":5640"},
		{"unix!/run/shardfs.sock", "unix", "/run/shardfs.sock"},
		{"/run/shardfs.sock", "unix", "/run/shardfs.sock"},
		{"./shardfs.sock", "unix", "./shardfs.sock"},
		{"shardfs.sock", "unix", "shardfs.sock"},
	}
	for _, tt := range tests {
		network, address, err := ParseAddr(tt.in)
		if err != nil || network != tt.network || address != tt.address {
			t.Errorf("ParseAddr(%q) = %q, %q, %v; want %q, %q, nil", tt.in, network, address, err, tt.network, tt.address)
		}
	}
	for _, bad := range []string{"tcp!host", "tcp!host!", "udp!host!1", "unix!", "host:port:x"} {
		if _, _, err := ParseAddr(bad); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("ParseAddr(%q) = %v; want an fs.ErrInvalid error", bad, err)
		}
	}
}

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fsrv.sock")

	// A stale socket from a server that is gone is replaced.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	l, err := Listen("unix!" + path)
	if err != nil {
		t.Fatalf("Listen over a stale socket = %v; want nil", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v; want a socket with mode 0600", fi.Mode())
	}
	// A live one is not.
	if l2, err := Listen(path); err == nil {
		l2.Close()
		t.Errorf("Listen over a live socket = nil; want an error")
	}

	fx := newFixture()
	srv := fx.server(t)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), l) }()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	srv.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve = %v; want nil", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Close, the socket file is still there: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("left in the directory: %v", entries)
	}

	// A regular file is never removed.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if l, err := Listen(file); err == nil {
		l.Close()
		t.Errorf("Listen over a regular file = nil; want an error")
	}
}

func TestListenTCP(t *testing.T) {
	l, err := Listen("tcp!127.0.0.1!0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, ok := l.Addr().(*net.TCPAddr); !ok {
		t.Errorf("Listen(tcp!127.0.0.1!0).Addr() = %v; want a TCP address", l.Addr())
	}
}

// The default socket's folder is never the temporary folder: without
// XDG_RUNTIME_DIR it is a folder of the user's own, made 0700; a folder
// that another user owns or others may write in is refused.
func TestRuntimeDir(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got, want := runtimeDir(1000), filepath.Join(home, ".cache", "shardfs"); got != want {
		t.Errorf("runtimeDir(1000) without XDG_RUNTIME_DIR = %q; want %q", got, want)
	}
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if got := runtimeDir(1000); got != "/run/user/1000" {
		t.Errorf("runtimeDir(1000) = %q; want $XDG_RUNTIME_DIR", got)
	}
	if got := runtimeDir(0); got != "/run" {
		t.Errorf("runtimeDir(0) = %q; want /run", got)
	}

	dir := filepath.Join(home, ".cache", "shardfs")
	if err := ensureDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("ensureDir made %v, %v; want mode 0700", fi, err)
	}
	open := filepath.Join(home, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o1777) // past the umask: a folder like /tmp
	if err := ensureDir(open); !errors.Is(err, ErrUnsafeDir) {
		t.Errorf("ensureDir(a folder of mode 1777) = %v; want ErrUnsafeDir", err)
	}
	if os.Getuid() == 0 {
		other := filepath.Join(home, "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if err := ensureDir(other); !errors.Is(err, ErrUnsafeDir) {
			t.Errorf("ensureDir(a folder of uid 4242) = %v; want ErrUnsafeDir", err)
		}
	}
}

// A default listener whose port is held by someone else is left out
// with a warning naming it; the others are served.
func TestOpenOptional(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, port, _ := net.SplitHostPort(held.Addr().String())
	sock := "unix!" + filepath.Join(t.TempDir(), "s.sock")
	ls, err := Open([]string{sock}, TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	var logb strings.Builder
	ls.OpenOptional([]string{"tcp!127.0.0.1!" + port + ",ro", "tcp!127.0.0.1!0,ro"}, slog.New(slog.NewTextHandler(&logb, nil)))
	if len(ls.List) != 2 || ls.List[0].Addr().Network() != "unix" || !IsReadOnly(ls.List[1]) {
		t.Errorf("after OpenOptional(a held port, a free one) the listeners are %v; want the unix socket and the free port, read-only", ls.List)
	}
	if s := logb.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "tcp!127.0.0.1!"+port+",ro") {
		t.Errorf("OpenOptional(a held port) logged %q; want a warning naming the address", s)
	}
}
