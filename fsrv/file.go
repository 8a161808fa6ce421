package fsrv

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"
)

// Permission bits, the same for owner, group and others: fsrv has no
// notion of users, only of what a file allows.
const (
	permRead  = 0444
	permWrite = 0222
	permExec  = 0111
)

// attr is what both engines report about a node.
type attr struct {
	path  uint64
	vers  uint32
	dir   bool
	perm  uint32 // permission bits, e.g. 0444
	size  uint64
	mtime time.Time
}

// perm returns a node's permission bits.
func perm(n File) uint32 {
	switch n := n.(type) {
	case *Dir:
		return permRead | permExec
	case *Text, *LogFile:
		return permRead
	case *Ctl:
		var p uint32
		if n.Handle != nil {
			p |= permWrite
		}
		if n.Usage != nil {
			p |= permRead
		}
		return p
	}
	return 0
}

func isDir(n File) bool {
	_, ok := n.(*Dir)
	return ok
}

// stat computes a node's attributes, calling its callbacks.
func (s *session) stat(n File) attr {
	e := n.base()
	a := attr{path: e.qidPath(), perm: s.perm(n)}
	switch n := n.(type) {
	case *Dir:
		a.dir = true
		// The digest covers private entries too: the version is shared
		// by every connection and must not flip between views.
		a.vers, a.mtime = e.observe(dirDigest(n.list()), s.now)
	case *Text:
		a = s.statText(n, n.content())
	case *Ctl:
		u := n.usage()
		a.size = uint64(len(u))
		a.vers, a.mtime = e.observe(digest([]byte(u)), s.now)
	case *LogFile:
		size := n.Source.Size()
		a.size = uint64(size)
		// The log only grows, so its size is a version that changes with
		// every append.
		a.vers = uint32(size)
		a.mtime = n.Source.ModTime()
		if a.mtime.IsZero() {
			a.mtime = e.firstSeen(s.now)
		}
	}
	return a
}

func (s *session) statText(t *Text, c []byte) attr {
	a := attr{path: t.qidPath(), perm: permRead, size: uint64(len(c))}
	a.vers, a.mtime = t.observe(digest(c), s.now)
	return a
}

// statOpen is stat for an open file. A Text shows the content its reads
// see, as it was when the file was opened: the first call (at open)
// computes the attributes from that content and later ones return them
// unchanged, so that a stat of an old open file does not make the
// version go back and forth.
func (s *session) statOpen(h *handle) attr {
	t, ok := h.node.(*Text)
	if !ok {
		return s.stat(h.node)
	}
	h.attrOnce.Do(func() { h.attr = s.statText(t, h.text) })
	return h.attr
}

// qidVersion returns the last version the server computed for n without
// calling its callbacks; directory listings use it, since stat'ing every
// entry of a listing would compute every file's content.
func qidVersion(n File) uint32 {
	if l, ok := n.(*LogFile); ok {
		return uint32(l.Source.Size())
	}
	e := n.base()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vers
}

func (t *Text) content() []byte {
	if t.Content == nil {
		return nil
	}
	return t.Content()
}

func (c *Ctl) usage() string {
	if c.Usage == nil {
		return ""
	}
	return c.Usage()
}

// openMode is what an open asks for, in either dialect.
type openMode struct {
	read, write, exec, trunc bool
}

// handle is one open of a node: what a fid holds from open to clunk.
type handle struct {
	node File
	text []byte // Text content or Ctl usage, fixed at open
	// attr is a Text's attributes for that content (see statOpen).
	attrOnce sync.Once
	attr     attr
	dir      []File // Dir entries, fixed at open
	// write is set when the file was opened for writing.
	write bool
	// partial is the start of a Ctl line that a client's cut left without
	// its newline. It and the three fields after it are guarded by the
	// Ctl's writeMu.
	partial []byte
	// written counts the bytes this open took, for the 4 KiB pages 9pfuse
	// cuts at.
	written int64
	// pending is the error of the line a write stopped at after applying
	// the lines before it; the next write on this open returns it.
	pending error
	// overlong is set when a line grew past the limit before its end
	// came: every later write on this open fails with it, so that the
	// rest of that line never runs as a command.
	overlong error
	// logMu guards shift and next.
	logMu sync.Mutex
	// shift is how far a LogFile read was moved forward because the data
	// it asked for had been dropped, and next the offset where that read
	// ended: a read at next continues it and is moved as far, so that a
	// sequential reader sees no byte twice. A read at any other offset is
	// a read at that absolute offset.
	shift, next int64
}

// open checks m against n's permissions and takes the snapshot reads of
// this open will see.
func (s *session) open(n File, m openMode) (*handle, error) {
	p := s.perm(n)
	switch {
	case m.read && p&permRead == 0:
		return nil, fmt.Errorf("%w: %s is write-only", fs.ErrPermission, FileName(n))
	case (m.write || m.trunc) && p&permWrite == 0:
		return nil, s.refuseWrite(n)
	case m.exec && p&permExec == 0:
		return nil, fmt.Errorf("%w: %s is not executable", fs.ErrPermission, FileName(n))
	}
	h := &handle{node: n, write: m.write}
	switch n := n.(type) {
	case *Dir:
		h.dir = s.list(n)
	case *Text:
		h.text = n.content()
	case *Ctl:
		if m.read {
			h.text = []byte(n.usage())
		}
	}
	return h, nil
}

// read serves a read at off of an open file. It never blocks.
func (h *handle) read(p []byte, off int64) int {
	if off < 0 {
		return 0
	}
	switch n := h.node.(type) {
	case *Text, *Ctl:
		if off >= int64(len(h.text)) {
			return 0
		}
		return copy(p, h.text[off:])
	case *LogFile:
		h.logMu.Lock()
		defer h.logMu.Unlock()
		shifted := h.shift > 0 && off == h.next
		want := off
		if shifted {
			want += h.shift
		}
		k, start := n.Source.ReadAt(p, want)
		switch {
		case k > 0 && start > want:
			// Data below start was dropped: the read returns data from
			// the oldest retained line, and a read where it ended goes
			// on from there.
			h.shift, h.next = start-off, off+int64(k)
		case shifted && k > 0:
			h.next = off + int64(k)
		}
		return k
	}
	return 0
}

// ioHeader is what a Twrite adds to its data (IOHDRSZ): clients cut a
// long write into Twrites of msize-ioHeader bytes of data.
const ioHeader = 24

// fusePage is the size of the writes 9pfuse gets from FUSE, which it cuts
// again at msize-ioHeader when its msize is smaller.
const fusePage = 4096

// libCut divides the writes hugelgupf/p9's client (the one shardfs write
// used) cuts a long write into: msize less its largest fixed message,
// rounded down to a multiple of 512 (65,024 bytes at msize 64 KiB). A
// 4 KiB page is a multiple too.
const libCut = 512

// write applies the lines of a write to an open Ctl (see Ctl for the
// rules): a line ends at its newline, or at the end of a write that is
// not a client's cut of a longer one; a write that is such a cut (a full
// Twrite of msize-ioHeader bytes, a multiple of 512 bytes, or one that
// ends a 4 KiB page of the bytes written through this open) keeps its last
// line for the next.
// When a line fails after lines of the same write were applied, the write
// reports the bytes applied, as a short count, and the next write on this
// open returns the error: a retry starts at the bad line, and its writer
// sees why.
func (s *session) write(h *handle, p []byte) (int, error) {
	c, ok := h.node.(*Ctl)
	if !ok || c.Handle == nil || !h.write || s.ro {
		return 0, s.refuseWrite(h.node)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if h.overlong != nil {
		return 0, h.overlong
	}
	if err := h.pending; err != nil {
		h.pending = nil
		return 0, err
	}
	if len(p) > MaxCtlWrite {
		// Its end may follow in the next write, which must not run as a
		// command of its own.
		h.partial = nil
		h.overlong = fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(p), MaxCtlWrite)
		return 0, h.overlong
	}
	const limit = MaxCtlWrite
	cut := len(p) == int(s.msize.Load())-ioHeader || len(p)%libCut == 0 || (h.written+int64(len(p)))%fusePage == 0
	applied := 0 // bytes of p up to the end of the last line applied
	changed := false
	defer func() {
		if changed {
			c.bump(s.now())
		}
	}()
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 && cut {
			if n := len(h.partial) + len(rest); n > limit {
				h.partial = nil
				h.overlong = fmt.Errorf("%w: a line of at least %d bytes, the limit is %d", ErrTooLarge, n, limit)
				return s.stopped(h, applied, false, h.overlong)
			}
			h.partial = append(h.partial, rest...)
			break
		}
		line, adv := rest, len(rest)
		if i >= 0 {
			line, adv = rest[:i], i+1
		}
		rest = rest[adv:]
		began := len(h.partial) > 0 // in a write already reported written
		if began {
			line = append(h.partial, line...)
			h.partial = nil
		}
		if len(line) > limit {
			return s.stopped(h, applied, began, fmt.Errorf("%w: a line of %d bytes, the limit is %d", ErrTooLarge, len(line), limit))
		}
		ok, err := s.apply(c, line)
		if err != nil {
			return s.stopped(h, applied, began, err)
		}
		changed = changed || ok
		applied += adv
	}
	h.written += int64(len(p))
	return len(p), nil
}

// stopped ends a write at a line that failed after applied bytes of it
// were applied: a short count, the error kept for the next write; or the
// error itself when nothing was applied. The error is kept as well when
// the line began in an earlier write (began): through 9pfuse or the
// kernel, that write's failure after an earlier cut succeeded reaches the
// program as a short count, and the program resends the rest of the line,
// which must fail too rather than run as a command.
func (s *session) stopped(h *handle, applied int, began bool, err error) (int, error) {
	h.partial = nil
	if applied == 0 {
		if began && h.overlong == nil {
			h.pending = err
		}
		return 0, err
	}
	h.written += int64(applied)
	if h.overlong == nil {
		h.pending = err
	}
	return applied, nil
}

// clunk applies the line an open Ctl still holds, as the file's last, or
// returns the error a short write left for a next write that never came.
// A connection that ends without a clunk drops the line instead: the rest
// of it may never have been sent.
func (s *session) clunk(h *handle) error {
	c, ok := h.node.(*Ctl)
	if !ok || c.Handle == nil {
		return nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	line, pending := h.partial, h.pending
	h.partial, h.pending = nil, nil
	if s.ending.Load() {
		return nil
	}
	if pending != nil {
		return pending
	}
	if len(line) == 0 {
		return nil
	}
	ok, err := s.apply(c, line)
	if ok {
		c.bump(s.now())
	}
	return err
}

// apply passes one line, without its newline, to c.Handle unless it is
// blank. The caller holds c.writeMu.
// It reports whether Handle applied a command; the caller bumps the
// file's version once per write that did.
func (s *session) apply(c *Ctl, line []byte) (bool, error) {
	l := strings.TrimSpace(string(line))
	if l == "" {
		return false, nil
	}
	if c.Raw {
		l = string(line)
	}
	if err := c.Handle(l); err != nil {
		return false, err
	}
	s.audit(c, line)
	return true, nil
}
