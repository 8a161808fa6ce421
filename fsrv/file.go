package fsrv

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
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

// statOpen is stat for a file just opened, reusing the content the open
// took rather than computing it again.
func (s *session) statOpen(h *handle) attr {
	if t, ok := h.node.(*Text); ok {
		return s.statText(t, h.text)
	}
	return s.stat(h.node)
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
	dir  []File // Dir entries, fixed at open
	// write is set when the file was opened for writing.
	write bool
	// partial is the start of a Ctl line that a write left without its
	// newline; guarded by the Ctl's writeMu.
	partial []byte
	// shift is how far a LogFile read was moved forward because the data it
	// asked for had been dropped; later reads of this open apply it.
	shift atomic.Int64
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
		shift := h.shift.Load()
		want := off + shift
		k, start := n.Source.ReadAt(p, want)
		if k > 0 && start > want {
			// Data below start was dropped. Linux reads at increasing
			// offsets, so remember the move for the reads that follow
			// and none of them returns these bytes again.
			h.shift.CompareAndSwap(shift, shift+start-want)
		}
		return k
	}
	return 0
}

// write applies the complete lines of a write to an open Ctl. A last
// line without a newline is kept in the open file and completed by its
// next write, or applied when the file is clunked (see clunk): 9pfuse cuts
// a long write into 4 KiB chunks wherever they fall. The write reports its
// full byte count; the error of a line is the error of the write that
// completes it, and what follows the bad line in that write is dropped.
func (s *session) write(h *handle, p []byte) (int, error) {
	c, ok := h.node.(*Ctl)
	if !ok || c.Handle == nil || !h.write || s.ro {
		return 0, s.refuseWrite(h.node)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if len(p) > MaxCtlWrite {
		h.partial = nil // its end is lost
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(p), MaxCtlWrite)
	}
	last := bytes.LastIndexByte(p, '\n')
	if last < 0 {
		if len(h.partial)+len(p) > MaxCtlWrite {
			n := len(h.partial) + len(p)
			h.partial = nil
			return 0, fmt.Errorf("%w: a line of more than %d bytes, the limit is %d", ErrTooLarge, n-1, MaxCtlWrite)
		}
		h.partial = append(h.partial, p...)
		return len(p), nil
	}
	lines := p[:last+1]
	if len(h.partial) > 0 {
		lines = append(h.partial, lines...)
	}
	h.partial = nil
	if err := s.apply(c, lines); err != nil {
		return 0, err
	}
	if rest := p[last+1:]; len(rest) > 0 {
		h.partial = append([]byte(nil), rest...)
	}
	return len(p), nil
}

// clunk applies the line an open Ctl still holds, as the file's last. A
// connection that ends without a clunk drops it instead: the rest of that
// line may never have been sent.
func (s *session) clunk(h *handle) error {
	c, ok := h.node.(*Ctl)
	if !ok || c.Handle == nil {
		return nil
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	line := h.partial
	h.partial = nil
	if len(line) == 0 || s.ending.Load() {
		return nil
	}
	return s.apply(c, line)
}

// apply passes each non-blank line of p to c.Handle, stopping at the first
// that fails. The caller holds c.writeMu.
func (s *session) apply(c *Ctl, p []byte) error {
	applied := false
	defer func() {
		if applied {
			c.bump(s.now())
			s.audit(c, p)
		}
	}()
	for rest := p; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		l := strings.TrimSpace(string(line))
		if l == "" {
			continue
		}
		if err := c.Handle(l); err != nil {
			return err
		}
		applied = true
	}
	return nil
}
