package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// --token-file refuses a file other users may read, naming its mode,
// and reading the token makes the process not dumpable (no core dump,
// no ptrace or /proc/PID/mem for the same user).
func TestTokenFileModeAndDumpable(t *testing.T) {
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) })
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		err  string // "" accepted
	}{
		{0o600, ""},
		{0o400, ""},
		{0o640, "mode 0640"},
		{0o604, "mode 0604"},
		{0o620, "mode 0620"},
	} {
		f := filepath.Join(dir, "token-"+tc.mode.String())
		if err := os.WriteFile(f, []byte("FILE-TOKEN-1234\n"), tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, tc.mode); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		tok, err := readToken(f)
		switch {
		case tc.err == "" && (err != nil || tok != "FILE-TOKEN-1234"):
			t.Errorf("readToken(file mode %04o) = %q, %v; want the token", tc.mode, tok, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "chmod 600")):
			t.Errorf("readToken(file mode %04o) = %q, %v; want an error naming %q", tc.mode, tok, err, tc.err)
		}
		if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
			t.Errorf("after readToken(file mode %04o) PR_GET_DUMPABLE = %d, %v; want 0", tc.mode, d, err)
		}
	}
}

// A secret file (--token-file, --etcd-password-file) of another user is
// refused even at mode 0600: its owner may chmod it, and chose what it
// holds. One of root's is accepted.
func TestSecretFileOwner(t *testing.T) {
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte("SECRET-1234\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other, me := os.Getuid()+1, os.Getuid()
	if me == 0 {
		// Root owns every file it writes: give this one away.
		other = 65534
		if err := os.Chown(f, other, other); err != nil {
			t.Fatal(err)
		}
	} else {
		// The file is ours; read it as if we were someone else.
		me, other = other, me
	}
	for _, flag := range []string{"--token-file", "--etcd-password-file"} {
		_, err := readSecretFile(flag, f, me)
		want := fmt.Sprintf("%s %s: owned by uid %d", flag, f, other)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("readSecretFile(%s, a file of uid %d, as uid %d) = %v; want an error containing %q", flag, other, me, err, want)
		}
	}
	if os.Getuid() == 0 {
		if err := os.Chown(f, 0, 0); err != nil {
			t.Fatal(err)
		}
		if b, err := readSecretFile("--token-file", f, 1000); err != nil || string(b) != "SECRET-1234\n" {
			t.Errorf("readSecretFile(a file of root, as uid 1000) = %q, %v; want its content", b, err)
		}
	}
}
