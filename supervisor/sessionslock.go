package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/internal/poll"
)

// sessionsLock is the file in --sessions DIR that one supervise holds
// (flock) for its life.
const sessionsLock = "supervise.lock"

// ErrSessionsInUse is wrapped by the error of a supervise whose --sessions
// folder another supervise holds.
var ErrSessionsInUse = errors.New("in use")

// lockSessions takes the --sessions folder for this supervise, or says who
// holds it: two supervisors on one folder would each start children that
// fight over the same shards' snapshots, and the second's would fail one
// by one, seconds later, on their folders' locks. The lock goes with the
// process (close on exec: no child inherits it).
func lockSessions(folder string) (release func(), err error) {
	if err := os.MkdirAll(folder, 0o700); err != nil {
		return nil, fmt.Errorf("--sessions: %w", err)
	}
	p := filepath.Join(folder, sessionsLock)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--sessions %s: cannot open %s: %w", folder, p, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("--sessions %s: %w by another supervise%s: stop it first, or give this one a folder of its own", folder, ErrSessionsInUse, holder(fd))
		}
		return nil, fmt.Errorf("--sessions %s: cannot lock %s: %w", folder, p, err)
	}
	unix.Ftruncate(fd, 0)
	unix.Pwrite(fd, []byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		unix.Ftruncate(fd, 0)
		unix.Close(fd)
	}, nil
}

// holder names the process whose PID the lock file holds, if any.
func holder(fd int) string {
	var b [32]byte
	n, _ := unix.Pread(fd, b[:], 0)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b[:max(n, 0)]))); err == nil && pid > 0 {
		return " (process " + strconv.Itoa(pid) + ")"
	}
	return ""
}

// waitChildFolders waits, up to bound, until no process holds a child's
// sessions folder: the children of a supervise that was killed save their
// sessions and exit on their own (within their shutdown, about 17 s at
// most), and a new child started before that fails on its folder's lock.
// It says which folder is still held past the bound.
func waitChildFolders(ctx context.Context, folder string, a Assignment, bound time.Duration, log *slog.Logger) error {
	held := func(id string) (bool, string) {
		fd, err := unix.Open(filepath.Join(folder, id, "lock"), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return false, "" // no folder or no lock yet: nobody holds it
		}
		defer unix.Close(fd)
		if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
			return true, holder(fd)
		}
		return false, "" // closing fd drops the shared lock
	}
	for _, b := range a.Blocks {
		isHeld, who := held(b.ID)
		if !isHeld {
			continue
		}
		log.Warn("a child's sessions folder is held, likely by a child of a supervise that was killed and is saving its sessions; waiting for it", "child", b.ID, "folder", filepath.Join(folder, b.ID), "holder", strings.Trim(who, " ()"), "bound", bound)
		err := poll.Until(ctx, "child "+b.ID+"'s sessions folder released", bound, 100*time.Millisecond, func() error {
			if isHeld, who := held(b.ID); isHeld {
				return fmt.Errorf("held%s", who)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("--sessions %s: %w: %w", folder, ErrSessionsInUse, err)
		}
	}
	return nil
}
