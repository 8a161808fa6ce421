package fsrv

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/srv9p"
)

// This file is the 9P2000 engine: the tree as callbacks of
// 9fans.net/go/plan9/srv9p.

// plan9Fid is what a srv9p fid holds. It is replaced, never changed, so
// that concurrent requests on one fid see a consistent value.
type plan9Fid struct {
	uname string
	// up is the chain of directories above node, for walks to "..".
	up   []*Dir
	node File
	h    *handle // set by Open
}

// gate counts the callbacks in progress on one connection: srv9p does not
// wait for its request goroutines, and no callback may run after the
// connection is served.
type gate struct {
	mu     sync.Mutex
	cond   *sync.Cond
	n      int
	closed bool
}

var errConnClosed = fmt.Errorf("%w: connection closed", fs.ErrInvalid)

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 && g.cond != nil {
		g.cond.Broadcast()
	}
}

// close refuses new callbacks and waits for those in progress.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	for g.n > 0 {
		g.cond.Wait()
	}
}

// plan9Server builds the srv9p callbacks for one connection.
func (s *session) plan9Server(g *gate, msize uint32) *srv9p.Server {
	// call runs a callback inside the gate, turns a panic into an I/O error
	// and converts the error: the one way out of this engine.
	call := func(name string, f func() error) (err error) {
		if !g.enter() {
			return plan9Err(errConnClosed)
		}
		defer g.leave()
		defer func() {
			if r := recover(); r != nil {
				s.logger().Error("fsrv: callback panicked", "op", name, "panic", r)
				err = s.plan9Err(fmt.Errorf("panic: %v", r))
			}
		}()
		return s.plan9Err(f())
	}
	aux := func(fid *srv9p.Fid) *plan9Fid {
		a, _ := fid.Aux().(*plan9Fid)
		if a == nil {
			// Unreachable: srv9p only passes fids that Attach or Walk set up.
			return &plan9Fid{node: s.Root}
		}
		return a
	}
	return &srv9p.Server{
		Msize: msize,
		Auth: func(context.Context, *srv9p.Fid, string, string) (plan9.Qid, error) {
			return plan9.Qid{}, plan9Err(errNoAuth)
		},
		Attach: func(_ context.Context, fid, _ *srv9p.Fid, user, aname string) (qid plan9.Qid, err error) {
			err = call("attach", func() error {
				root := &plan9Fid{uname: user, node: s.Root}
				var names []string
				if a := strings.Trim(aname, "/"); a != "" {
					names = strings.Split(a, "/")
				}
				f, k, err := s.walk9(root, names)
				if err != nil {
					return err
				}
				if k < len(names) {
					return fs.ErrNotExist
				}
				if !isDir(f.node) {
					return fmt.Errorf("%w: %s", errNotDir, aname)
				}
				// walk(5): ".." at the root of the attach stays there,
				// so the chain above it is forgotten.
				f.up = nil
				fid.SetAux(f)
				qid = s.qid9(s.stat(f.node))
				return nil
			})
			return qid, err
		},
		Walk: func(_ context.Context, fid, newfid *srv9p.Fid, names []string) (qids []plan9.Qid, err error) {
			err = call("walk", func() error {
				from := aux(fid)
				f, k, err := s.walk9(from, names)
				if err != nil {
					return err
				}
				// Walk reports the QIDs of the names it could walk; it
				// changes newfid only when it walked them all (walk(5)).
				cur := from
				for _, name := range names[:k] {
					cur, _, _ = s.walk9(cur, []string{name})
					n := cur.node
					qids = append(qids, s.qid9(attr{path: n.base().qidPath(), vers: qidVersion(n), dir: isDir(n)}))
				}
				if k == len(names) {
					newfid.SetAux(f)
				}
				return nil
			})
			return qids, err
		},
		Open: func(_ context.Context, fid *srv9p.Fid, mode uint8) error {
			return call("open", func() error {
				f := aux(fid)
				m := openMode{trunc: mode&plan9.OTRUNC != 0}
				switch mode & 3 {
				case plan9.OREAD:
					m.read = true
				case plan9.OWRITE:
					m.write = true
				case plan9.ORDWR:
					m.read, m.write = true, true
				case plan9.OEXEC:
					m.read, m.exec = true, !isDir(f.node)
				}
				if mode&plan9.ORCLOSE != 0 {
					return errFixedTree
				}
				h, err := s.open(f.node, m)
				if err != nil {
					return err
				}
				g := *f
				g.h = h
				fid.SetAux(&g)
				fid.SetQid(s.qid9(s.statOpen(h)))
				return nil
			})
		},
		Create: func(context.Context, *srv9p.Fid, string, plan9.Perm, uint8) (plan9.Qid, error) {
			return plan9.Qid{}, plan9Err(errFixedTree)
		},
		Remove: func(context.Context, *srv9p.Fid) error {
			return plan9Err(errFixedTree)
		},
		Read: func(_ context.Context, fid *srv9p.Fid, data []byte, offset int64) (n int, err error) {
			err = call("read", func() error {
				f := aux(fid)
				if f.h == nil {
					return fs.ErrInvalid
				}
				if isDir(f.node) {
					var err error
					n, err = fid.ReadDir(data, offset, func(i int, d *plan9.Dir) bool {
						if i >= len(f.h.dir) {
							return false
						}
						*d = s.dir9(f.h.dir[i], f.uname)
						return true
					})
					return err
				}
				n = f.h.read(data, offset)
				return nil
			})
			return n, err
		},
		Write: func(_ context.Context, fid *srv9p.Fid, data []byte, _ int64) (n int, err error) {
			err = call("write", func() error {
				f := aux(fid)
				if f.h == nil {
					return fs.ErrInvalid
				}
				var err error
				n, err = s.write(f.h, data)
				return err
			})
			return n, err
		},
		Stat: func(_ context.Context, fid *srv9p.Fid) (d *plan9.Dir, err error) {
			err = call("stat", func() error {
				f := aux(fid)
				// An open fid shows the content its reads see, fixed
				// at open (stat(5) of an open file).
				var dir plan9.Dir
				if f.h != nil {
					dir = s.dir9Attr(f.node, s.statOpen(f.h), f.uname)
				} else {
					dir = s.dir9(f.node, f.uname)
				}
				if f.node == s.Root {
					dir.Name = "/"
				}
				d = &dir
				return nil
			})
			return d, err
		},
		Wstat: func(_ context.Context, fid *srv9p.Fid, d *plan9.Dir) error {
			return call("wstat", func() error { return s.wstat(aux(fid).node, d) })
		},
		// Clunk applies the line an open Ctl still holds. srv9p has no
		// way to report its error, so it is logged (the Ctl's handler
		// may say more, as shardfs does in its events).
		Clunk: func(fid *srv9p.Fid) {
			a, _ := fid.Aux().(*plan9Fid)
			if a == nil || a.h == nil {
				return
			}
			if err := call("clunk", func() error { return s.clunk(a.h) }); err != nil {
				s.logger().Info("fsrv: the last line of a ctl write failed at clunk", "file", FileName(a.node), "err", clipEname(err.Error(), 512))
			}
		},
	}
}

// wstat accepts what shells and 9pfuse send before a write (length 0, and
// times, which are derived) and refuses every other change.
func (s *session) wstat(n File, d *plan9.Dir) error {
	switch {
	case s.ro:
		// srv9p passes only a wstat that changes something.
		return s.refuseWrite(n)
	case d.Name != "" && d.Name != FileName(n):
		return errFixedTree
	case d.Mode != ^plan9.Perm(0) || d.Uid != "" || d.Gid != "":
		return fmt.Errorf("%w: attributes are fixed", fs.ErrPermission)
	case d.Length != ^uint64(0) && s.perm(n)&permWrite == 0:
		return s.refuseWrite(n)
	case d.Length != ^uint64(0) && d.Length != 0:
		return fmt.Errorf("%w: only truncation to zero", fs.ErrInvalid)
	}
	return nil
}

// walk9 walks names from f. It returns the fid state after walking all of
// them, or how many it could walk when one is missing (k < len(names)); err
// is set only when the first one is missing.
func (s *session) walk9(f *plan9Fid, names []string) (*plan9Fid, int, error) {
	up := f.up
	n := f.node
	for k, name := range names {
		d, ok := n.(*Dir)
		if !ok {
			if k == 0 {
				return nil, 0, fmt.Errorf("%w: %s is not a directory", fs.ErrNotExist, FileName(n))
			}
			return nil, k, nil
		}
		if name == ".." {
			if len(up) > 0 {
				n, up = up[len(up)-1], up[:len(up)-1]
			}
			continue
		}
		c := s.lookup(d, name)
		if c == nil {
			if k == 0 {
				return nil, 0, fs.ErrNotExist
			}
			return nil, k, nil
		}
		// Copy: up may share its array with another fid's chain.
		up = append(up[:len(up):len(up)], d)
		n = c
	}
	return &plan9Fid{uname: f.uname, up: up, node: n}, len(names), nil
}

func (s *Server) qid9(a attr) plan9.Qid {
	q := plan9.Qid{Path: a.path, Vers: a.vers}
	if a.dir {
		q.Type = plan9.QTDIR
	}
	return q
}

// dir9 is a node's stat in 9P2000 form. Files are owned by whoever attached:
// fsrv has no users, and 9pfuse shows the name.
func (s *session) dir9(n File, uname string) plan9.Dir {
	return s.dir9Attr(n, s.stat(n), uname)
}

// dir9Attr is dir9 with the attributes given.
func (s *session) dir9Attr(n File, a attr, uname string) plan9.Dir {
	if uname == "" {
		uname = "none"
	}
	mode := plan9.Perm(a.perm)
	if a.dir {
		mode |= plan9.DMDIR
	}
	t := uint32(a.mtime.Unix())
	return plan9.Dir{
		Qid:    s.qid9(a),
		Mode:   mode,
		Atime:  t,
		Mtime:  t,
		Length: a.size,
		Name:   FileName(n),
		Uid:    uname,
		Gid:    uname,
		Muid:   uname,
	}
}
