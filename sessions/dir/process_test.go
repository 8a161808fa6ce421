package dir

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The helper process: TestMain runs helper instead of the tests when
// helperEnv is set, so flock is tried from a process of its own (a lock
// is per open file description; another Store in this process would not
// tell a second process apart).
const (
	helperEnv = "SHARDFS_SESSIONS_DIR_HELPER"
	folderEnv = "SHARDFS_SESSIONS_DIR_FOLDER"
)

// helper runs one helper mode and returns the exit code.
func helper(mode string) int {
	path := os.Getenv(folderEnv)
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	defer s.Close()
	switch mode {
	case "hold":
		// Holds the lock until stdin closes.
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "save":
		err := s.Save(context.Background(), 0, snap(1))
		fmt.Println("save:", err)
		return 0
	case "save-forever":
		for i := int64(1); ; i++ {
			if err := s.Save(context.Background(), 0, snap(i)); err != nil {
				fmt.Println("save:", err)
				return 1
			}
			if i == 1 {
				fmt.Println("saving")
			}
		}
	}
	fmt.Println("unknown helper mode", mode)
	return 2
}

// startHelper starts the test binary as a helper on folder and waits for
// its first line.
func startHelper(t *testing.T, bin, mode, folder string, attr *syscall.SysProcAttr) (*exec.Cmd, io.WriteCloser, string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, folderEnv+"="+folder)
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case line := <-lines:
		return cmd, stdin, line
	case <-time.After(30 * time.Second): // a process boundary: bounded
		t.Fatalf("helper %s said nothing in 30 s", mode)
	}
	return nil, nil, ""
}

func TestSecondProcessRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	cmd, stdin, line := startHelper(t, os.Args[0], "hold", path, nil)
	if line != "locked" {
		t.Fatalf("helper said %q; want locked", line)
	}
	for i := range 2 { // a refused Open leaves the holder's PID in place
		_, err := Open(path, Options{})
		var inUse *InUseError
		if !errors.As(err, &inUse) || inUse.PID != cmd.Process.Pid {
			t.Fatalf("Open #%d while process %d holds the folder = %v; want an InUseError naming it", i+1, cmd.Process.Pid, err)
		}
		want := fmt.Sprintf("sessions folder %s is in use by process %d", path, cmd.Process.Pid)
		if err.Error() != want {
			t.Fatalf("Open #%d error = %q; want %q", i+1, err, want)
		}
	}

	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(path, "lock")); len(b) != 0 {
		t.Errorf("lock file after the holder closed = %q; want it empty", b)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the holder closed = %v", err)
	}
	defer s.Close()
	b, _ := os.ReadFile(filepath.Join(path, "lock"))
	if got, _ := strconv.Atoi(strings.TrimSpace(string(b))); got != os.Getpid() {
		t.Errorf("lock file holds %q; want this process's PID %d", b, os.Getpid())
	}
}

func TestLockReleasedByACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	cmd, _, line := startHelper(t, os.Args[0], "hold", path, nil)
	if line != "locked" {
		t.Fatalf("helper said %q; want locked", line)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the holder was killed = %v", err)
	}
	s.Close()
}

func TestSecondStoreInProcessRefused(t *testing.T) {
	path := t.TempDir()
	s := open(t, path, nil)
	_, err := Open(path, Options{})
	var inUse *InUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second Open = %v; want an InUseError naming this process", err)
	}
	s.Close()
	open(t, path, nil)
}

// TestKilledWhileSaving kills a process in the middle of saving: the folder
// still holds a whole snapshot, and the next Open removes any temp file.
func TestKilledWhileSaving(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sessions")
	cmd, _, line := startHelper(t, os.Args[0], "save-forever", path, nil)
	if line != "saving" {
		t.Fatalf("helper said %q; want saving", line)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	temps := 0
	for _, name := range entries(t, path) {
		if strings.Contains(name, tmpMark) {
			temps++
		}
	}
	t.Logf("the kill left %d temp files", temps)
	s := open(t, path, nil)
	got, ok, err := s.Load(context.Background(), 0)
	if !ok || err != nil || got.Sequence < 1 || !equal(got, snap(got.Sequence)) {
		t.Fatalf("Load(0) after the kill = %+v, %v, %v; want a whole snapshot", got, ok, err)
	}
	if names := entries(t, path); strings.Join(names, " ") != "lock shard-0.json" {
		t.Errorf("folder holds %q after Open; want only lock and shard-0.json", names)
	}
}

// TestSaveUnwritableFolderAsAnotherUser is the unwritable folder for root,
// whom a 0500 mode does not stop: the helper runs as nobody.
func TestSaveUnwritableFolderAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a helper as another user; TestSaveErrors covers other users")
	}
	// nobody must reach the binary: copy it out of the build's 0700 folder.
	top, err := os.MkdirTemp("", "sessions-dir-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(top, "dir.test")
	copyFile(t, os.Args[0], bin, 0o755)
	path := filepath.Join(top, "sessions")
	mkdir(0o700)(t, path)
	write(t, filepath.Join(path, "lock"), "", 0o600)
	chown(t, filepath.Join(path, "lock"), nobody)
	chown(t, path, nobody)
	if err := os.Chmod(path, 0o500); err != nil {
		t.Fatal(err)
	}
	attr := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd, _, line := startHelper(t, bin, "save", path, attr)
	cmd.Wait()
	if !strings.HasPrefix(line, "save: sessions folder "+path+" is not writable") {
		t.Fatalf("helper running as uid %d said %q; want Save to say the folder is not writable", nobody, line)
	}
}

func copyFile(t *testing.T, from, to string, m os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	write(t, to, string(b), m)
}
