package dir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/sessions"
)

// ErrClosed is returned by Load and Save after Close.
var ErrClosed = errors.New("sessions folder is closed")

// InUseError is returned by Open when another open Store, usually in
// another process, holds the folder.
type InUseError struct {
	Path string
	PID  int // 0 when the holder has not written it yet
}

func (e *InUseError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("sessions folder %s is in use by process %d", e.Path, e.PID)
	}
	return fmt.Sprintf("sessions folder %s is in use by another process", e.Path)
}

// Options configure a Store.
type Options struct {
	// Logger receives the warnings about modes Open and Load tightened
	// (nil: discarded).
	Logger *slog.Logger
}

// Store is a folder of snapshots, one file per shard. It holds the folder's
// lock until Close.
type Store struct {
	path string
	log  *slog.Logger
	uid  int
	dir  int // the folder, opened once: every file is reached through it
	lock int
	held bool // the flock on lock is this Store's

	// beforeRename, when a test sets it, runs in a save after the temp
	// file is written and synced.
	beforeRename func(shard int)

	wg sync.WaitGroup // the I/O in flight, which Close waits for

	mu     sync.Mutex
	closed bool
	saving map[int]chan struct{} // a shard's token: one save at a time
	warned map[int]bool          // shards whose file mode was warned about
}

var _ core.SessionStore = (*Store)(nil)

const lockName = "lock"

// tmpMark is in the name of every temp file and of nothing else.
const tmpMark = ".tmp-"

// Open opens the folder at path, creating it with mode 0700 if absent, and
// locks it.
func Open(path string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{path: path, log: log, uid: os.Geteuid(), dir: -1, lock: -1,
		saving: map[int]chan struct{}{}, warned: map[int]bool{}}
	if err := s.open(); err != nil {
		s.release()
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	if err := os.MkdirAll(s.path, 0o700); err != nil {
		var pe *os.PathError
		if errors.Is(err, unix.ENOTDIR) && errors.As(err, &pe) {
			return fmt.Errorf("cannot create sessions folder %s: %s is not a directory", s.path, pe.Path)
		}
		return fmt.Errorf("cannot create sessions folder %s: %w", s.path, err)
	}
	fd, err := unix.Open(s.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("sessions folder %s is not a directory", s.path)
	}
	if err != nil {
		return fmt.Errorf("cannot open sessions folder %s: %w", s.path, err)
	}
	s.dir = fd
	var st unix.Stat_t
	if err := unix.Fstat(s.dir, &st); err != nil {
		return fmt.Errorf("cannot stat sessions folder %s: %w", s.path, err)
	}
	perm := st.Mode & 0o7777
	switch {
	case int(st.Uid) != s.uid:
		return fmt.Errorf("sessions folder %s is owned by uid %d, not by this process's uid %d", s.path, st.Uid, s.uid)
	case perm&0o022 != 0:
		// Someone else may already have put or swapped files in it:
		// tightening now would not undo that.
		return fmt.Errorf("sessions folder %s is writable by group or others (mode %04o); make it 0700", s.path, perm)
	case perm&0o077 != 0:
		if err := unix.Fchmod(s.dir, perm&^0o077); err != nil {
			return fmt.Errorf("cannot tighten sessions folder %s from mode %04o: %w", s.path, perm, err)
		}
		s.log.Warn("sessions folder was readable by others; tightened it", "folder", s.path,
			"mode", fmt.Sprintf("%04o", perm), "now", fmt.Sprintf("%04o", perm&^0o077))
	}
	if err := s.takeLock(); err != nil {
		return err
	}
	return s.removeTemps()
}

func (s *Store) takeLock() error {
	p := filepath.Join(s.path, lockName)
	// O_CLOEXEC: a child process must not keep the folder locked after
	// this one is gone.
	fd, err := unix.Openat(s.dir, lockName, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("sessions folder %s: %s is a symlink; refusing to follow it", s.path, p)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("sessions folder %s: %s is a directory, not a lock file", s.path, p)
	case err != nil:
		return fmt.Errorf("sessions folder %s: cannot open %s: %w", s.path, p, err)
	}
	s.lock = fd
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("sessions folder %s: cannot stat %s: %w", s.path, p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("sessions folder %s: %s is not a regular file", s.path, p)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		var b [32]byte
		n, _ := unix.Pread(fd, b[:], 0)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:max(n, 0)])))
		return &InUseError{Path: s.path, PID: pid}
	} else if err != nil {
		return fmt.Errorf("sessions folder %s: cannot lock %s: %w", s.path, p, err)
	}
	s.held = true
	pid := strconv.Itoa(os.Getpid()) + "\n"
	if err := unix.Ftruncate(fd, 0); err != nil {
		return fmt.Errorf("sessions folder %s: cannot write %s: %w", s.path, p, err)
	}
	if _, err := unix.Pwrite(fd, []byte(pid), 0); err != nil {
		return fmt.Errorf("sessions folder %s: cannot write %s: %w", s.path, p, err)
	}
	return nil
}

// removeTemps removes what saves interrupted by a crash left. The lock is
// held, so no save of another process is under way.
func (s *Store) removeTemps() error {
	fd, err := unix.Openat(s.dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cannot list sessions folder %s: %w", s.path, err)
	}
	f := os.NewFile(uintptr(fd), s.path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("cannot list sessions folder %s: %w", s.path, err)
	}
	for _, name := range names {
		if !strings.Contains(name, tmpMark) {
			continue
		}
		if err := unix.Unlinkat(s.dir, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("cannot remove %s, left by an interrupted save: %w", filepath.Join(s.path, name), err)
		}
		s.log.Info("removed the temp file of an interrupted save", "file", filepath.Join(s.path, name))
	}
	return nil
}

// Close waits for the I/O in flight, even that of calls whose ctx ended,
// then releases the folder.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	return s.release()
}

func (s *Store) release() error {
	var err error
	if s.lock >= 0 {
		// The file stays: removing it would let two processes lock two
		// different files of the same name. The PID goes, so that a
		// stale one is never shown; only the holder's own, though.
		if s.held {
			unix.Ftruncate(s.lock, 0)
		}
		err = unix.Close(s.lock) // releases the flock
		s.lock = -1
	}
	if s.dir >= 0 {
		err = errors.Join(err, unix.Close(s.dir))
		s.dir = -1
	}
	return err
}

func name(shard int) string { return "shard-" + strconv.Itoa(shard) + ".json" }

// start counts one I/O goroutine; false after Close.
func (s *Store) start() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// Load returns shard's snapshot. A file that is not a regular file of this
// process's user, or that does not decode, is an error; a mode that lets
// others read it is tightened to 0600, with one warning.
func (s *Store) Load(ctx context.Context, shard int) (core.Snapshot, bool, error) {
	if shard < 0 {
		return core.Snapshot{}, false, fmt.Errorf("sessions: no shard %d", shard)
	}
	if err := ctx.Err(); err != nil {
		return core.Snapshot{}, false, err
	}
	if !s.start() {
		return core.Snapshot{}, false, ErrClosed
	}
	type result struct {
		snap core.Snapshot
		ok   bool
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer s.wg.Done()
		var r result
		r.snap, r.ok, r.err = s.load(shard)
		done <- r
	}()
	select {
	case r := <-done:
		return r.snap, r.ok, r.err
	case <-ctx.Done():
		return core.Snapshot{}, false, ctx.Err()
	}
}

func (s *Store) load(shard int) (core.Snapshot, bool, error) {
	p := filepath.Join(s.path, name(shard))
	// O_NONBLOCK: a FIFO put in the file's place must not hang the open.
	fd, err := unix.Openat(s.dir, name(shard), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return core.Snapshot{}, false, nil
	case errors.Is(err, unix.ELOOP):
		return core.Snapshot{}, false, fmt.Errorf("%s is a symlink; refusing to follow it", p)
	case err != nil:
		return core.Snapshot{}, false, fmt.Errorf("cannot open %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return core.Snapshot{}, false, fmt.Errorf("cannot stat %s: %w", p, err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return core.Snapshot{}, false, fmt.Errorf("%s is a directory, not a snapshot file", p)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return core.Snapshot{}, false, fmt.Errorf("%s is not a regular file", p)
	case int(st.Uid) != s.uid:
		return core.Snapshot{}, false, fmt.Errorf("%s is owned by uid %d, not by this process's uid %d; refusing it", p, st.Uid, s.uid)
	case st.Size > sessions.MaxSize:
		return core.Snapshot{}, false, fmt.Errorf("%s: %w: %d bytes, larger than the %d a snapshot may be", p, sessions.ErrMalformed, st.Size, sessions.MaxSize)
	}
	if perm := st.Mode & 0o7777; perm&0o077 != 0 {
		s.tighten(shard, fd, p, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, sessions.MaxSize+1))
	if err != nil {
		return core.Snapshot{}, false, fmt.Errorf("cannot read %s: %w", p, err)
	}
	snap, err := sessions.Decode(b)
	if err != nil {
		return core.Snapshot{}, false, fmt.Errorf("%s: %w", p, err)
	}
	return snap, true, nil
}

// tighten makes a snapshot file 0600, warning once per shard: it still
// holds what was saved (the folder let no one else in), only others could
// read the session id.
func (s *Store) tighten(shard, fd int, p string, perm uint32) {
	err := unix.Fchmod(fd, 0o600)
	s.mu.Lock()
	warned := s.warned[shard]
	s.warned[shard] = true
	s.mu.Unlock()
	if warned {
		return
	}
	if err != nil {
		s.log.Warn("snapshot file is readable by others and could not be tightened", "file", p,
			"mode", fmt.Sprintf("%04o", perm), "err", err)
		return
	}
	s.log.Warn("snapshot file was readable by others; tightened it to 0600", "file", p, "mode", fmt.Sprintf("%04o", perm))
}

// Save replaces shard's file atomically. When ctx ends first, Save returns
// at once; the write goes on in the background and is abandoned before the
// rename if it has not reached it, so the file holds the old snapshot or
// the new one, never a part. Saves of one shard run one at a time, so an
// abandoned one never lands after a later one.
func (s *Store) Save(ctx context.Context, shard int, snap core.Snapshot) error {
	if shard < 0 {
		return fmt.Errorf("sessions: no shard %d", shard)
	}
	b, err := sessions.Encode(snap)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !s.start() {
		return ErrClosed
	}
	token := s.token(shard)
	select {
	case token <- struct{}{}:
	case <-ctx.Done():
		s.wg.Done()
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		defer s.wg.Done()
		defer func() { <-token }()
		done <- s.save(ctx, shard, b)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) token(shard int) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.saving[shard]
	if !ok {
		t = make(chan struct{}, 1)
		s.saving[shard] = t
	}
	return t
}

func (s *Store) save(ctx context.Context, shard int, b []byte) error {
	final := name(shard)
	tmp := fmt.Sprintf(".%s%s%016x", final, tmpMark, rand.Uint64())
	fd, err := unix.Openat(s.dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return fmt.Errorf("sessions folder %s is not writable: cannot create a file in it: %w", s.path, err)
	case err != nil:
		return fmt.Errorf("sessions folder %s: cannot create a file in it: %w", s.path, err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Unlinkat(s.dir, tmp, 0)
		}
	}()
	f := os.NewFile(uintptr(fd), filepath.Join(s.path, tmp))
	err = unix.Fchmod(fd, 0o600) // past a umask that took the owner's bits
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sessions folder %s: cannot write a snapshot: %w", s.path, err)
	}
	if s.beforeRename != nil {
		s.beforeRename(shard)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := unix.Renameat(s.dir, tmp, s.dir, final); err != nil {
		p := filepath.Join(s.path, final)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s is a directory; cannot replace it with a snapshot", p)
		}
		return fmt.Errorf("cannot replace %s: %w", p, err)
	}
	ok = true
	if err := unix.Fsync(s.dir); err != nil {
		return fmt.Errorf("sessions folder %s: saved %s, but syncing the folder failed: %w", s.path, final, err)
	}
	return nil
}
