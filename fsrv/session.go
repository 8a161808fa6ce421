package fsrv

import (
	"fmt"
	"io/fs"
	"slices"
	"sync/atomic"
)

// session is one connection's view of the server's tree: a read-only
// connection sees no private node and may write nothing.
type session struct {
	*Server
	ro bool
	// roCert: ro because the listener's rules file names the client
	// certificate ro, not because the listener is ",ro".
	roCert bool
	// conn is the connection, named in the log line of a write refused
	// on a read-only listener.
	conn *conn
	// msize is the negotiated message size, which error strings must fit
	// (9P2000) and by which a ctl write tells a client's cut of a longer
	// write (msize-24 bytes) from a whole one.
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
func (s *session) lookup(d *Dir, name string) File {
	n := d.lookup(name)
	if n != nil && s.ro && isPrivate(n) {
		return nil
	}
	return n
}

// list returns d's entries as this session sees them.
func (s *session) list(d *Dir) []File {
	list := d.list()
	if !s.ro || !slices.ContainsFunc(list, isPrivate) {
		return list
	}
	return slices.DeleteFunc(slices.Clone(list), isPrivate)
}

// perm returns a node's permission bits as this session sees them.
func (s *session) perm(n File) uint32 {
	p := perm(n)
	if s.ro {
		p &^= permWrite
	}
	return p
}

// refuseWrite is the error of a write, truncation or attribute change
// refused on n. A refusal because the listener is read-only (",ro") is
// logged, rate-limited server-wide: the first in a minute is a line with
// the remote address, the client certificate's name and the file, the
// others in that minute are counted in the next line's more_refused.
// The refusal touches nothing shared, so the other connections go on.
func (s *session) refuseWrite(n File) error {
	if s.ro && perm(n)&permWrite != 0 {
		if skipped, ok := s.rateLimit(refusedReadOnly); ok {
			args := []any{"remote", "-", "client", "-", "file", FileName(n), "why", "the listener is ,ro"}
			if s.roCert {
				args[7] = "the listener's rules file names the certificate ro"
			}
			if s.conn != nil {
				args[1], args[3] = s.conn.remote(), s.conn.client()
			}
			if skipped > 0 {
				args = append(args, "more_refused", skipped)
			}
			s.logger().Warn("fsrv: write refused on a read-only listener", args...)
		}
	}
	return fmt.Errorf("%w: %s", fs.ErrPermission, s.readOnly(n))
}

// refusedReadOnly is the rate limit's key of writes on a read-only
// listener.
const refusedReadOnly = "write on a read-only listener"

// readOnly names why a write is refused.
func (s *session) readOnly(n File) string {
	switch {
	case s.roCert && perm(n)&permWrite != 0:
		return FileName(n) + " is read-only for this certificate (the listener's rules file names it ro)"
	case s.ro && perm(n)&permWrite != 0:
		return FileName(n) + " is read-only on this listener"
	}
	return FileName(n) + " is read-only"
}
