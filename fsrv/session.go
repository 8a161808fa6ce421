package fsrv

import (
	"slices"
	"sync/atomic"
)

// session is one connection's view of the server's tree: a read-only
// connection sees no private node and may write nothing.
type session struct {
	*Server
	ro bool
	// msize is the negotiated message size, which error strings must fit
	// (9P2000).
	msize atomic.Uint32
	// ending is set once the connection is going away: the clunks that
	// follow are the engine's cleanup, not the client's.
	ending atomic.Bool
}

// plan9Err converts err to a 9P2000 error that fits this session's msize.
func (s *session) plan9Err(err error) error {
	if err == nil {
		return nil
	}
	return plan9Error(clipEname(ename(err), s.msize.Load()))
}

// lookup finds the entry called name in d, as this session sees it.
func (s *session) lookup(d *Dir, name string) Node {
	n := d.lookup(name)
	if n != nil && s.ro && isPrivate(n) {
		return nil
	}
	return n
}

// list returns d's entries as this session sees them.
func (s *session) list(d *Dir) []Node {
	list := d.list()
	if !s.ro || !slices.ContainsFunc(list, isPrivate) {
		return list
	}
	return slices.DeleteFunc(slices.Clone(list), isPrivate)
}

// perm returns a node's permission bits as this session sees them.
func (s *session) perm(n Node) uint32 {
	p := perm(n)
	if s.ro {
		p &^= permWrite
	}
	return p
}

// readOnly names why a write is refused.
func (s *session) readOnly(n Node) string {
	if s.ro && perm(n)&permWrite != 0 {
		return NodeName(n) + " is read-only on this listener"
	}
	return NodeName(n) + " is read-only"
}
