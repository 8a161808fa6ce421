package fsrv

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// A File is one file or directory of the tree: a *Dir, *Text, *Ctl or *LogFile.
//
// A node's identity is its pointer. Its QID path (the inode number Linux
// shows, and what tail -f and the kernel's caches key on) is taken from a
// process-wide counter the first time the node is served and never changes,
// so Dir.List and Dir.Lookup must return the same pointer for the same file
// every time; a new pointer is a new file. Files must not be copied after
// first use.
type File interface {
	base() *entry
}

// Dir is a directory whose entries come from callbacks evaluated when a
// client walks through it or lists it, so entries may appear and disappear.
// Its mode is r-x for everyone.
type Dir struct {
	// Name is the entry's name in its parent; the root's name is ignored
	// ("/" is shown).
	Name string

	// List returns the directory's entries in the order a listing shows
	// them. It is called when the directory is opened (a listing is a
	// snapshot taken then), when it is stat'ed (the QID version changes when
	// the set of entries does) and, when Lookup is nil, at every walk
	// through the directory. A nil List is an empty directory. It must not
	// block and may be called concurrently. Entries must have distinct,
	// non-empty names without '/' and other than "." and "..".
	List func() []File

	// Lookup returns the entry called name, or nil if there is none.
	// Optional: when nil, a walk searches List(). Set it when List is
	// expensive, for example a directory with an entry per shard.
	Lookup func(name string) File

	// Private hides the directory from read-only connections (see
	// Server.Serve and Listen's ,ro option): it is absent from their
	// listings and walks.
	Private bool

	entry
}

// NewDir returns a directory with a fixed list of entries.
func NewDir(name string, entries ...File) *Dir {
	return &Dir{Name: name, List: func() []File { return entries }}
}

// Text is a read-only file whose content is computed when it is opened.
// Its mode is r for everyone.
type Text struct {
	Name string

	// Content returns the file's bytes. It is called at every open, and the
	// open file keeps that value, so that one cat sees one consistent text
	// however many reads it takes (a stat of the open file shows that
	// value's length too); and at every stat of a file not open, since the
	// size shown is the length of the current content. Text ends with a newline: that
	// is Content's job, fsrv does not add it. Content must not block, may be
	// called concurrently, and must not modify a slice it has returned.
	Content func() []byte

	// Private hides the file from read-only connections.
	Private bool

	entry
}

// Ctl is a file of line commands. A write may carry several lines; each
// non-blank line is passed to Handle in order.
//
// A line ends at its newline or at the end of the write that carries it,
// so a single write without a newline ("printf stop > ctl") is a whole
// command whose error that write returns. Only a write that is a client's
// cut of a longer write(2) keeps its last line open for the next write on
// the same fid: one of exactly msize-24 bytes (the data of a full Twrite,
// where Linux, plan9port and 9fans.net/go cut), or a multiple of 4 KiB or
// one that ends a 4 KiB page of the bytes written through this open (where
// FUSE cuts for 9pfuse, which cuts again at msize-24). A write of 4 KiB
// without a newline is therefore kept, and applied at the clunk at the
// latest. A line so kept and not completed by the clunk is applied at
// the clunk: under 9P2000.L its error is the Rclunk's, under 9P2000, which
// cannot report one, it is logged (a Handle may also record it, as shardfs
// does in events). A connection that ends without a clunk drops a kept
// line, whose end may never have been sent.
//
// A write stops at the first line whose Handle fails, and what follows
// that line is not applied. When no line of the write was applied, the
// write returns the error. Otherwise it returns the count of the bytes
// applied (the lines before the bad one), a short count as Unix write(2)
// gives, and the next write on that fid returns the error without
// applying anything: a client that resends from the short count (the
// kernel, 9pfuse, cat) starts at the bad line and its writer sees the
// error. When the bad line began in an earlier write (a kept line), the
// write returns the error and so does the next one: through 9pfuse or the
// kernel a failure after a cut that succeeded reaches the program as a
// short count, and the program resends the rest of the line, which must
// not run as a command. A clunk that comes before that next write returns
// the error under 9P2000.L.
//
// A write or a line longer than MaxCtlWrite is refused with ErrTooLarge.
// When the end of the overlong line has not come yet (a write over
// MaxCtlWrite, or a kept line that grows past it),
// every later write on that fid fails with that error, so that the rest
// of the line never runs as a command of its own; open the file again.
// Truncation (O_TRUNC, a setattr or wstat of size 0) is accepted and does
// nothing, because shells truncate before they write.
//
// Its mode is rw when Usage is set and w otherwise.
type Ctl struct {
	Name string

	// Handle applies one command line. The line has no newline and, unless
	// Raw is set, no leading or trailing white space; blank lines are
	// skipped. Writes to
	// one Ctl are serialised, so Handle sees the lines of one write together.
	// Errors should wrap fs.ErrInvalid (a bad command), fs.ErrPermission,
	// fs.ErrNotExist, ErrBusy or ErrTooLarge; any other error reaches the
	// client as an I/O error. A nil Handle makes the file read-only.
	Handle func(line string) error

	// Usage returns what a read of the file returns: the accepted commands,
	// one usage line each, ending with a newline. It is called at open (the
	// open file keeps the value) and at stat (for the size). Optional: a
	// Ctl without Usage is write-only, and opening it for reading is refused
	// with permission denied.
	Usage func() string

	// Raw gives Handle each line as written, without its newline but with
	// its white space, so that a size limit counts the bytes the client
	// wrote (a line of white space only is still skipped).
	Raw bool

	// Private hides the file from read-only connections.
	Private bool

	// Path is the file's path in the tree ("3/ctl"), which audit lines
	// name (see AuditRecord); Name when empty.
	Path string

	entry
}

// MaxCtlWrite is the largest write a Ctl accepts.
const MaxCtlWrite = 64 << 10

// LogSource is the append-only log behind a LogFile. Offsets are absolute
// byte offsets that are never reused. journal.Log implements it.
type LogSource interface {
	// ReadAt copies bytes starting at absolute offset off into p without
	// blocking. It returns n == 0 at or past the end. When off is below the
	// oldest retained byte, the bytes come from the oldest retained line
	// and start (> off) says where they begin; otherwise start == off.
	ReadAt(p []byte, off int64) (n int, start int64)
	// Size returns the absolute offset of the end of the log; it only grows.
	Size() int64
	// ModTime returns the time of the last append, or the zero time.
	ModTime() time.Time
}

// LogFile is a read-only file over an append-only log with absolute
// offsets: its size is the log's Size (the end offset, never the bytes
// retained), a read at an offset reads there, a read at the end returns end
// of file at once (cat terminates; tail -f follows by polling the size),
// and a read below the oldest retained offset returns data from the oldest
// retained line. A read at the offset where that read ended continues the
// retained data, so that a reader that reads at increasing offsets sees no
// byte twice; a read at any other offset, on the same open file, reads at
// that absolute offset (pread(size-50) returns the last 50 bytes). Its mode
// is r for everyone.
type LogFile struct {
	Name   string
	Source LogSource

	// Private hides the file from read-only connections.
	Private bool

	entry
}

// qidPaths hands out QID paths. It is process-wide so that a path is never
// reused within a server's lifetime even when nodes come and go or several
// servers share them.
var qidPaths atomic.Uint64

// entry is the bookkeeping every node carries: its QID path and what the
// server last saw of it, from which the QID version and mtime are derived.
type entry struct {
	path atomic.Uint64

	writeMu sync.Mutex // serialises Ctl writes

	mu    sync.Mutex
	seen  bool
	sum   uint64    // digest of the content when last observed
	vers  uint32    // bumped whenever the digest changes or a Ctl write succeeds
	mtime time.Time // when that last happened
}

func (e *entry) base() *entry { return e }

// qidPath returns the node's QID path, assigning one at first use.
func (e *entry) qidPath() uint64 {
	if p := e.path.Load(); p != 0 {
		return p
	}
	e.path.CompareAndSwap(0, qidPaths.Add(1))
	return e.path.Load()
}

// observe records the digest of what the node shows now and returns its
// version and modification time. The server only learns that synthetic
// content changed when it looks, so mtime is the time it first saw the
// change.
func (e *entry) observe(sum uint64, now func() time.Time) (uint32, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.seen || e.sum != sum {
		if e.seen {
			e.vers++
		}
		e.seen = true
		e.sum = sum
		e.mtime = now()
	}
	return e.vers, e.mtime
}

// bump records a change the server made itself (a Ctl write).
func (e *entry) bump(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.vers++
	e.mtime = now
}

// firstSeen returns when the node was first observed, observing it now if
// it never was.
func (e *entry) firstSeen(now func() time.Time) time.Time {
	_, t := e.observe(0, now)
	return t
}

var digestSeed = maphash.MakeSeed()

func digest(b []byte) uint64 { return maphash.Bytes(digestSeed, b) }

// dirDigest covers the names and identities of a directory's entries.
func dirDigest(list []File) uint64 {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	var buf [8]byte
	for _, n := range list {
		if n == nil {
			continue
		}
		h.WriteString(FileName(n))
		binary.LittleEndian.PutUint64(buf[:], n.base().qidPath())
		h.Write(buf[:])
	}
	return h.Sum64()
}

// FileName is the name of a tree entry, or "" for a File of another type.
func FileName(n File) string {
	switch n := n.(type) {
	case *Dir:
		return n.Name
	case *Text:
		return n.Name
	case *Ctl:
		return n.Name
	case *LogFile:
		return n.Name
	}
	return ""
}

// isPrivate reports whether n is hidden from read-only connections.
func isPrivate(n File) bool {
	switch n := n.(type) {
	case *Dir:
		return n.Private
	case *Text:
		return n.Private
	case *Ctl:
		return n.Private
	case *LogFile:
		return n.Private
	}
	return false
}

// lookup finds the entry called name in d.
func (d *Dir) lookup(name string) File {
	if name == "" || name == "." || name == ".." {
		return nil
	}
	if d.Lookup != nil {
		if n := d.Lookup(name); !isNil(n) {
			return n
		}
		return nil
	}
	for _, n := range d.list() {
		if FileName(n) == name {
			return n
		}
	}
	return nil
}

// list returns d's entries without nil ones.
func (d *Dir) list() []File {
	if d.List == nil {
		return nil
	}
	list := d.List()
	for i, n := range list {
		if isNil(n) {
			// Copy rather than filter in place: the slice is the caller's.
			out := make([]File, 0, len(list)-1)
			out = append(out, list[:i]...)
			for _, n := range list[i+1:] {
				if !isNil(n) {
					out = append(out, n)
				}
			}
			return out
		}
	}
	return list
}

// isNil reports whether n is nil or a typed nil pointer, which callbacks
// return easily (a nil *Dir from a map lookup).
func isNil(n File) bool {
	switch n := n.(type) {
	case nil:
		return true
	case *Dir:
		return n == nil
	case *Text:
		return n == nil
	case *Ctl:
		return n == nil
	case *LogFile:
		return n == nil
	}
	return false
}
