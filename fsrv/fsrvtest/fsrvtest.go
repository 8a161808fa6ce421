// Package fsrvtest checks that a tree served by fsrv behaves as its 9P
// clients expect, in the style of testing/fstest.TestFS.
package fsrvtest

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"path"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/shardfs/shardfs/fsrv"
)

// TestTree serves root in-process and checks it through two clients no one
// here wrote: the hugelgupf/p9 client (9P2000.L) and 9fans.net/go's client
// (9P2000). For each it runs testing/fstest.TestFS over the readable files
// (expected lists paths that must be there, as for fstest.TestFS), then
// checks what fsrv promises of every node:
//
//   - a listing and a walk agree on every entry's QID, and QID paths are
//     unique across the tree;
//   - directories are r-x, files have no x bit, and no mode depends on the
//     user;
//   - opening a file beyond its mode (writing a read-only file, reading a
//     write-only one) is refused with EACCES / "permission denied";
//   - files cannot be created or removed;
//   - a missing name is ENOENT / "file not found";
//   - a clone of a walked fid opens and reads on its own.
//
// The tree must not change while TestTree runs, and writes are not tried:
// a Ctl's commands are the caller's to test.
func TestTree(t *testing.T, root *fsrv.Dir, expected ...string) {
	t.Helper()
	srv := &fsrv.Server{Root: root}
	t.Cleanup(func() { srv.Close() })
	serve := func() net.Conn {
		c, s := net.Pipe()
		go srv.ServeConn(context.Background(), s)
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("9P2000.L", func(t *testing.T) {
		cl, err := p9.NewClient(serve())
		if err != nil {
			t.Fatalf("p9.NewClient = %v", err)
		}
		r, err := cl.Attach("")
		if err != nil {
			t.Fatalf("Attach = %v", err)
		}
		fsys := &dotlFS{root: r}
		if err := fstest.TestFS(fsys, expected...); err != nil {
			t.Error(err)
		}
		checkDotL(t, r)
	})
	t.Run("9P2000", func(t *testing.T) {
		conn, err := client.NewConn(serve())
		if err != nil {
			t.Fatalf("client.NewConn = %v", err)
		}
		fsys, err := conn.Attach(nil, "fsrvtest", "")
		if err != nil {
			t.Fatalf("Attach = %v", err)
		}
		if err := fstest.TestFS(&plan9FS{fsys: fsys}, expected...); err != nil {
			t.Error(err)
		}
		check9(t, fsys)
	})
}

// checkMode checks the permission model of one node.
func checkMode(t *testing.T, name string, mode fs.FileMode) {
	t.Helper()
	perm := mode.Perm()
	owner := perm >> 6 & 7
	if perm != owner<<6|owner<<3|owner {
		t.Errorf("%s: mode %v depends on the user; want the same bits for everyone", name, mode)
	}
	switch {
	case mode.IsDir() && perm != 0555:
		t.Errorf("%s: directory mode %v; want dr-xr-xr-x", name, mode)
	case !mode.IsDir() && (perm&0111 != 0 || perm == 0):
		t.Errorf("%s: file mode %v; want r, w or rw only", name, mode)
	}
}

// node is one entry found by walking the tree.
type node struct {
	name string // path from the root
	mode fs.FileMode
	path uint64
}

func checkDotL(t *testing.T, root p9.File) {
	var nodes []node
	var walk func(dir p9.File, name string)
	walk = func(dir p9.File, name string) {
		_, d, err := dir.Walk(nil)
		if err != nil {
			t.Fatalf("%s: clone = %v", name, err)
		}
		defer d.Close()
		if _, _, err := d.Open(p9.ReadOnly); err != nil {
			t.Fatalf("%s: open = %v", name, err)
		}
		ents, err := readdirAll(d)
		if err != nil {
			t.Fatalf("%s: readdir = %v", name, err)
		}
		for _, e := range ents {
			child := path.Join(name, e.Name)
			qids, f, err := dir.Walk([]string{e.Name})
			if err != nil {
				t.Errorf("%s: listed but walk = %v", child, err)
				continue
			}
			if qids[0].Path != e.QID.Path || qids[0].Type != e.QID.Type {
				t.Errorf("%s: walk QID %v; listing QID %v", child, qids[0], e.QID)
			}
			_, _, a, err := f.GetAttr(p9.AttrMaskAll)
			if err != nil {
				t.Errorf("%s: getattr = %v", child, err)
			}
			mode := a.Mode.OSMode()
			nodes = append(nodes, node{child, mode, e.QID.Path})
			checkMode(t, child, mode)
			if mode.IsDir() {
				walk(f, child)
			} else {
				checkOpenDotL(t, f, child, mode)
			}
			f.Close()
		}
	}
	walk(root, ".")
	checkUnique(t, nodes)

	if _, _, err := root.Walk([]string{"fsrvtest-no-such-file"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("walk to a missing name = %v; want ENOENT", err)
	}
	_, d, _ := root.Walk(nil)
	if _, _, _, err := d.Create("fsrvtest-new", p9.WriteOnly, 0644, p9.NoUID, p9.NoGID); err == nil {
		t.Errorf("create = nil; want an error")
	}
	d.Close()
	for _, n := range nodes {
		if err := root.UnlinkAt(n.name, 0); err == nil && !strings.Contains(n.name, "/") {
			t.Errorf("unlink %s = nil; want an error", n.name)
		}
	}
}

// checkOpenDotL checks the opens a file's mode allows and refuses, and
// that two clones read the same content independently.
func checkOpenDotL(t *testing.T, f p9.File, name string, mode fs.FileMode) {
	t.Helper()
	for _, o := range []struct {
		flags p9.OpenFlags
		need  fs.FileMode
	}{{p9.ReadOnly, 0444}, {p9.WriteOnly, 0222}} {
		_, g, err := f.Walk(nil)
		if err != nil {
			t.Fatalf("%s: clone = %v", name, err)
		}
		_, _, err = g.Open(o.flags)
		g.Close()
		switch {
		case mode&o.need == 0 && !errors.Is(err, linux.EACCES):
			t.Errorf("%s (mode %v): open %v = %v; want EACCES", name, mode, o.flags, err)
		case mode&o.need != 0 && err != nil:
			t.Errorf("%s (mode %v): open %v = %v; want nil", name, mode, o.flags, err)
		}
	}
	if mode&0444 == 0 {
		return
	}
	var got [2]string
	for i := range got {
		_, g, err := f.Walk(nil)
		if err != nil {
			t.Fatalf("%s: clone = %v", name, err)
		}
		if _, _, err := g.Open(p9.ReadOnly); err != nil {
			t.Fatalf("%s: open = %v", name, err)
		}
		b, err := io.ReadAll(io.NewSectionReader(g, 0, 1<<40))
		if err != nil {
			t.Errorf("%s: read = %v", name, err)
		}
		got[i] = string(b)
		g.Close()
	}
	if got[0] != got[1] {
		t.Errorf("%s: two opens read %q and %q; want the same", name, got[0], got[1])
	}
}

func readdirAll(d p9.File) ([]p9.Dirent, error) {
	var all []p9.Dirent
	off := uint64(0)
	for {
		ents, err := d.Readdir(off, 4096)
		if err != nil && err != io.EOF {
			return nil, err
		}
		if len(ents) == 0 {
			return all, nil
		}
		all = append(all, ents...)
		off = ents[len(ents)-1].Offset
	}
}

func checkUnique(t *testing.T, nodes []node) {
	t.Helper()
	seen := map[uint64]string{}
	for _, n := range nodes {
		if other, ok := seen[n.path]; ok {
			t.Errorf("%s and %s share QID path %#x", n.name, other, n.path)
		}
		seen[n.path] = n.name
	}
}

func check9(t *testing.T, fsys *client.Fsys) {
	var nodes []node
	var walk func(name string)
	walk = func(name string) {
		fid, err := fsys.Open(name, plan9.OREAD)
		if err != nil {
			t.Fatalf("%s: open = %v", name, err)
		}
		dirs, err := fid.Dirreadall()
		fid.Close()
		if err != nil {
			t.Fatalf("%s: read directory = %v", name, err)
		}
		for _, d := range dirs {
			child := path.Join(name, d.Name)
			st, err := fsys.Stat(child)
			if err != nil {
				t.Errorf("%s: listed but stat = %v", child, err)
				continue
			}
			if st.Qid != d.Qid && (st.Qid.Path != d.Qid.Path || st.Qid.Type != d.Qid.Type) {
				t.Errorf("%s: stat QID %v; listing QID %v", child, st.Qid, d.Qid)
			}
			mode := fs.FileMode(d.Mode & 0777)
			if d.Mode&plan9.DMDIR != 0 {
				mode |= fs.ModeDir
			}
			nodes = append(nodes, node{child, mode, d.Qid.Path})
			checkMode(t, child, mode)
			if mode.IsDir() {
				walk(child)
				continue
			}
			for _, o := range []struct {
				mode uint8
				need fs.FileMode
			}{{plan9.OREAD, 0444}, {plan9.OWRITE, 0222}} {
				f, err := fsys.Open(child, o.mode)
				if err == nil {
					f.Close()
				}
				switch {
				case mode&o.need == 0 && (err == nil || !strings.HasPrefix(err.Error(), "permission denied")):
					t.Errorf("%s (mode %v): open %d = %v; want permission denied", child, mode, o.mode, err)
				case mode&o.need != 0 && err != nil:
					t.Errorf("%s (mode %v): open %d = %v; want nil", child, mode, o.mode, err)
				}
			}
			if err := fsys.Remove(child); err == nil || !strings.HasPrefix(err.Error(), "permission denied") {
				t.Errorf("remove %s = %v; want permission denied", child, err)
			}
		}
	}
	walk(".")
	checkUnique(t, nodes)
	if _, err := fsys.Stat("fsrvtest-no-such-file"); err == nil {
		t.Errorf("stat of a missing name = nil; want an error")
	}
	if _, err := fsys.Create("fsrvtest-new", plan9.OWRITE, 0644); err == nil || !strings.HasPrefix(err.Error(), "permission denied") {
		t.Errorf("create = %v; want permission denied", err)
	}
}

// dotlFS is an io/fs view of a 9P2000.L tree, for fstest.TestFS. Files
// that cannot be read (write-only Ctl files) are left out of listings,
// since TestFS reads every file it finds.
type dotlFS struct{ root p9.File }

func (d *dotlFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	var names []string
	if name != "." {
		names = strings.Split(name, "/")
	}
	_, f, err := d.root.Walk(names)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: toFS(err)}
	}
	info, err := dotlInfo(f, path.Base(name))
	if err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: toFS(err)}
	}
	return &dotlFile{f: f, info: info}, nil
}

func toFS(err error) error {
	switch {
	case errors.Is(err, linux.ENOENT):
		return fs.ErrNotExist
	case errors.Is(err, linux.EACCES):
		return fs.ErrPermission
	}
	return err
}

func dotlInfo(f p9.File, name string) (fileInfo, error) {
	_, _, a, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		return fileInfo{}, err
	}
	return fileInfo{
		name:  name,
		size:  int64(a.Size),
		mode:  a.Mode.OSMode(),
		mtime: time.Unix(int64(a.MTimeSeconds), int64(a.MTimeNanoSeconds)),
	}, nil
}

type dotlFile struct {
	f    p9.File
	info fileInfo
	off  int64
	ents []fs.DirEntry // listing not yet returned by ReadDir
	read bool          // the listing was fetched
}

func (f *dotlFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *dotlFile) Close() error               { return f.f.Close() }

func (f *dotlFile) Read(p []byte) (int, error) {
	if f.info.IsDir() {
		return 0, &fs.PathError{Op: "read", Path: f.info.name, Err: errors.New("is a directory")}
	}
	n, err := f.f.ReadAt(p, f.off)
	f.off += int64(n)
	if n == 0 && (err == nil || err == io.EOF) && len(p) > 0 {
		return 0, io.EOF
	}
	return n, err
}

func (f *dotlFile) ReadDir(n int) ([]fs.DirEntry, error) {
	if !f.read {
		f.read = true
		ents, err := readdirAll(f.f)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			_, c, err := f.f.Walk(nil)
			if err != nil {
				return nil, err
			}
			c.Close()
			// Walk from an opened fid is refused; walk from a fresh clone
			// of the directory instead.
			_, g, err := f.f.Walk([]string{e.Name})
			if err != nil {
				return nil, err
			}
			info, err := dotlInfo(g, e.Name)
			g.Close()
			if err != nil {
				return nil, err
			}
			if info.mode&0444 == 0 {
				continue
			}
			f.ents = append(f.ents, fs.FileInfoToDirEntry(info))
		}
	}
	return take(&f.ents, n)
}

// take returns up to n entries (all for n <= 0) as fs.ReadDirFile does.
func take(ents *[]fs.DirEntry, n int) ([]fs.DirEntry, error) {
	if n <= 0 {
		out := *ents
		*ents = nil
		return out, nil
	}
	if len(*ents) == 0 {
		return nil, io.EOF
	}
	k := min(n, len(*ents))
	out := (*ents)[:k:k]
	*ents = (*ents)[k:]
	return out, nil
}

// plan9FS is an io/fs view of a 9P2000 tree, for fstest.TestFS.
type plan9FS struct{ fsys *client.Fsys }

func (p *plan9FS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	fid, err := p.fsys.Open(name, plan9.OREAD)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	d, err := fid.Stat()
	if err != nil {
		fid.Close()
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	info := plan9Info(d)
	info.name = path.Base(name)
	return &plan9File{fid: fid, info: info}, nil
}

func plan9Info(d *plan9.Dir) fileInfo {
	mode := fs.FileMode(d.Mode & 0777)
	if d.Mode&plan9.DMDIR != 0 {
		mode |= fs.ModeDir
	}
	return fileInfo{name: d.Name, size: int64(d.Length), mode: mode, mtime: time.Unix(int64(d.Mtime), 0)}
}

type plan9File struct {
	fid  *client.Fid
	info fileInfo
	ents []fs.DirEntry
	read bool
}

func (f *plan9File) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *plan9File) Close() error               { return f.fid.Close() }

func (f *plan9File) Read(p []byte) (int, error) {
	if f.info.IsDir() {
		return 0, &fs.PathError{Op: "read", Path: f.info.name, Err: errors.New("is a directory")}
	}
	if len(p) == 0 {
		return 0, nil // the 9fans client answers EOF; io.Reader wants 0, nil
	}
	return f.fid.Read(p)
}

func (f *plan9File) ReadDir(n int) ([]fs.DirEntry, error) {
	if !f.read {
		f.read = true
		dirs, err := f.fid.Dirreadall()
		if err != nil {
			return nil, err
		}
		for _, d := range dirs {
			if info := plan9Info(d); info.mode&0444 != 0 {
				f.ents = append(f.ents, fs.FileInfoToDirEntry(info))
			}
		}
	}
	return take(&f.ents, n)
}

type fileInfo struct {
	name  string
	size  int64
	mode  fs.FileMode
	mtime time.Time
}

func (i fileInfo) Name() string       { return i.name }
func (i fileInfo) Size() int64        { return i.size }
func (i fileInfo) Mode() fs.FileMode  { return i.mode }
func (i fileInfo) ModTime() time.Time { return i.mtime }
func (i fileInfo) IsDir() bool        { return i.mode.IsDir() }
func (i fileInfo) Sys() any           { return nil }
