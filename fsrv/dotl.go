package fsrv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// This file is the 9P2000.L engine: the tree as p9.Files for
// github.com/hugelgupf/p9, and the framing shim in front of it that
// answers Tauth and Tflush.

// StatFSType is the file-system type 9P2000.L statfs reports:
// FUSE_SUPER_MAGIC. GNU tail -f watches a file with inotify when statfs
// names a type coreutils lists as local (v9fs, 0x01021997, is), and inotify
// never fires for changes made on the server. Coreutils lists FUSE as
// remote in every version (recent versions also treat unknown types as
// remote, but older ones treated them as local), so tail polls; 9pfuse
// mounts report the same type.
const StatFSType = 0x65735546

// dotlOTrunc is O_TRUNC in 9P2000.L open flags (P9_DOTL_TRUNC).
const dotlOTrunc = 01000

var errNoAuth = fmt.Errorf("%w: no authentication required", fs.ErrNotExist)

// dotlAttacher hands out the root of one connection's tree.
type dotlAttacher struct{ s *session }

func (a dotlAttacher) Attach() (p9.File, error) {
	return &dotlFile{s: a.s, node: a.s.Root}, nil
}

// attachQID returns the QID of the directory a Tattach with aname attaches
// to, walking it as hugelgupf/p9 does (one leading slash dropped, the rest
// split at slashes). p9 walks aname from the root but answers Rattach with
// the root's QID; dotlStream puts this one in its place. A name that is
// not a directory is errNotDir, which dotlStream answers itself: p9 would
// attach to the file, and diodls crashes on that.
func (a dotlAttacher) attachQID(aname string) (q p9.QID, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r) // p9's own walk reports it
		}
	}()
	root := &dotlFile{s: a.s, node: a.s.Root}
	f, err := root.walk(strings.Split(strings.TrimPrefix(aname, "/"), "/"))
	if err != nil {
		return p9.QID{}, err
	}
	n := f.node
	if !isDir(n) {
		return p9.QID{}, fmt.Errorf("%w: %s", errNotDir, aname)
	}
	return root.qid(attr{path: n.base().qidPath(), vers: qidVersion(n), dir: true}), nil
}

// dotlFile is a fid's view of a node: walked to, then maybe opened.
type dotlFile struct {
	noMutation

	s    *session
	node File
	h    atomic.Pointer[handle] // set by Open
}

var _ p9.File = (*dotlFile)(nil)

// guard turns a panic in a callback into EIO for the request, logged with
// the server's logger (p9 would recover it too, as EFAULT).
func (f *dotlFile) guard(err *error) {
	if r := recover(); r != nil {
		f.s.logger().Error("fsrv: callback panicked", "file", FileName(f.node), "panic", r)
		*err = dotlError(fmt.Errorf("panic: %v", r))
	}
}

func (f *dotlFile) qid(a attr) p9.QID {
	t := p9.TypeRegular
	if a.dir {
		t = p9.TypeDir
	}
	return p9.QID{Type: t, Version: a.vers, Path: a.path}
}

// attrMask is what GetAttr fills in: the basic stat fields, which Linux
// requires in the valid mask.
var attrMask = p9.AttrMask{
	Mode: true, NLink: true, UID: true, GID: true, RDev: true,
	ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true,
}

func (f *dotlFile) getattr(n File) (p9.QID, p9.AttrMask, p9.Attr) {
	return f.attrOf(f.s.stat(n))
}

// attrOf is a node's attributes in 9P2000.L form.
func (f *dotlFile) attrOf(a attr) (p9.QID, p9.AttrMask, p9.Attr) {
	mode := p9.ModeRegular
	nlink := p9.NLink(1)
	if a.dir {
		mode = p9.ModeDirectory
		nlink = 2
	}
	sec, nsec := uint64(a.mtime.Unix()), uint64(a.mtime.Nanosecond())
	return f.qid(a), attrMask, p9.Attr{
		Mode:             mode | p9.FileMode(a.perm),
		NLink:            nlink,
		Size:             a.size,
		BlockSize:        4096,
		Blocks:           (a.size + 511) / 512,
		ATimeSeconds:     sec,
		ATimeNanoSeconds: nsec,
		MTimeSeconds:     sec,
		MTimeNanoSeconds: nsec,
		CTimeSeconds:     sec,
		CTimeNanoSeconds: nsec,
	}
}

// walk resolves names (zero or one, as p9 walks one step at a time).
func (f *dotlFile) walk(names []string) (*dotlFile, error) {
	n := f.node
	for _, name := range names {
		d, ok := n.(*Dir)
		if !ok {
			return nil, fmt.Errorf("%w: %s is not a directory", fs.ErrNotExist, FileName(n))
		}
		if n = f.s.lookup(d, name); n == nil {
			return nil, fs.ErrNotExist
		}
	}
	return &dotlFile{s: f.s, node: n}, nil
}

// Walk implements p9.File. A walk of no names is a clone: Linux clones a
// fid at every open, and the clone must be a file of its own.
func (f *dotlFile) Walk(names []string) (qids []p9.QID, nf p9.File, err error) {
	defer f.guard(&err)
	g, err := f.walk(names)
	if err != nil {
		return nil, nil, dotlError(err)
	}
	for range names {
		// The version is the last one computed: a walk should not compute
		// the content of every file it passes; GetAttr and Open do.
		n := g.node
		qids = append(qids, f.qid(attr{path: n.base().qidPath(), vers: qidVersion(n), dir: isDir(n)}))
	}
	return qids, g, nil
}

// WalkGetAttr implements p9.File for the 9P2000.L.Google extension the
// hugelgupf client uses.
func (f *dotlFile) WalkGetAttr(names []string) (qids []p9.QID, nf p9.File, mask p9.AttrMask, at p9.Attr, err error) {
	defer f.guard(&err)
	g, err := f.walk(names)
	if err != nil {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, dotlError(err)
	}
	qid, mask, at := f.getattr(g.node)
	for range names {
		qids = append(qids, qid)
	}
	return qids, g, mask, at, nil
}

// GetAttr implements p9.File.
func (f *dotlFile) GetAttr(p9.AttrMask) (qid p9.QID, mask p9.AttrMask, at p9.Attr, err error) {
	defer f.guard(&err)
	// An open fid shows the content its reads see, fixed at open.
	if h := f.h.Load(); h != nil {
		qid, mask, at = f.attrOf(f.s.statOpen(h))
		return qid, mask, at, nil
	}
	qid, mask, at = f.getattr(f.node)
	return qid, mask, at, nil
}

// SetAttr implements p9.File. Truncation to zero of a writable file is
// accepted and ignored (Linux sends it for `echo x > ctl`), as are times,
// which are derived; everything else is refused, and on a read-only
// connection every change is.
func (f *dotlFile) SetAttr(valid p9.SetAttrMask, at p9.SetAttr) error {
	writable := f.s.perm(f.node)&permWrite != 0
	switch {
	case valid.Permissions || valid.UID || valid.GID:
		return dotlError(fmt.Errorf("%w: attributes are fixed", fs.ErrPermission))
	case valid.Size && !writable, f.s.ro && !valid.Empty():
		return dotlError(f.s.refuseWrite(f.node))
	case valid.Size && at.Size != 0:
		return dotlError(fmt.Errorf("%w: only truncation to zero", fs.ErrInvalid))
	}
	return nil
}

// StatFS implements p9.File.
func (f *dotlFile) StatFS() (p9.FSStat, error) {
	return p9.FSStat{Type: StatFSType, BlockSize: 4096, NameLength: 255}, nil
}

// Open implements p9.File.
func (f *dotlFile) Open(flags p9.OpenFlags) (qid p9.QID, iounit uint32, err error) {
	defer f.guard(&err)
	// O_TRUNC needs write permission, as in Linux, and is then a no-op:
	// only Ctl files are writable. O_CREAT needs nothing: the file exists.
	m := openMode{trunc: flags&dotlOTrunc != 0}
	switch flags.Mode() {
	case p9.ReadOnly:
		m.read = true
	case p9.WriteOnly:
		m.write = true
	case p9.ReadWrite:
		m.read, m.write = true, true
	default:
		return p9.QID{}, 0, dotlError(fs.ErrInvalid)
	}
	h, err := f.s.open(f.node, m)
	if err != nil {
		return p9.QID{}, 0, dotlError(err)
	}
	f.h.Store(h)
	return f.qid(f.s.statOpen(h)), 0, nil
}

// ReadAt implements p9.File. It never blocks: hugelgupf/p9 cannot cancel a
// read on Tflush, and Linux waits for the Rflush even through SIGKILL.
func (f *dotlFile) ReadAt(p []byte, off int64) (n int, err error) {
	defer f.guard(&err)
	h := f.h.Load()
	if h == nil {
		return 0, dotlError(fs.ErrInvalid)
	}
	if isDir(f.node) {
		return 0, dotlError(fmt.Errorf("%w: is a directory", fs.ErrInvalid))
	}
	return h.read(p, off), nil
}

// WriteAt implements p9.File. The offset is ignored: every write is a set
// of commands.
func (f *dotlFile) WriteAt(p []byte, _ int64) (n int, err error) {
	defer f.guard(&err)
	h := f.h.Load()
	if h == nil {
		return 0, dotlError(fs.ErrInvalid)
	}
	n, err = f.s.write(h, p)
	return n, dotlError(err)
}

// Readdir implements p9.File over the listing taken at open. An entry's
// offset is its index plus one, so a client resumes where it stopped.
func (f *dotlFile) Readdir(offset uint64, count uint32) (ents p9.Dirents, err error) {
	defer f.guard(&err)
	h := f.h.Load()
	if h == nil || !isDir(f.node) {
		return nil, dotlError(fs.ErrInvalid)
	}
	size := 0
	for i := offset; i < uint64(len(h.dir)) && size < int(count); i++ {
		n := h.dir[i]
		t := p9.TypeRegular
		if isDir(n) {
			t = p9.TypeDir
		}
		name := FileName(n)
		ents = append(ents, p9.Dirent{
			QID:    p9.QID{Type: t, Version: qidVersion(n), Path: n.base().qidPath()},
			Offset: i + 1,
			Type:   t,
			Name:   name,
		})
		size += 13 + 8 + 1 + 2 + len(name)
	}
	return ents, nil
}

// Close implements p9.File: a clunk, which applies the line an open Ctl
// still holds; that line's error is the Rclunk's. It may be called while
// another fid still uses the file (p9 shares it with xattr fids, which
// fsrv never lets a walk create), so it releases nothing else.
func (f *dotlFile) Close() (err error) {
	defer f.guard(&err)
	if h := f.h.Load(); h != nil {
		return dotlError(f.s.clunk(h))
	}
	return nil
}

// FSync implements p9.File.
func (f *dotlFile) FSync() error { return nil }

// Lock implements p9.File: there is nothing to lock, so every lock succeeds.
func (f *dotlFile) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusOK, nil
}

// Readlink implements p9.File; there are no symlinks.
func (f *dotlFile) Readlink() (string, error) { return "", dotlError(fs.ErrInvalid) }

// Renamed implements p9.File; it is never called, as nothing can be renamed.
func (f *dotlFile) Renamed(p9.File, string) {}

var errNoXattr = fmt.Errorf("%w: no extended attributes", fs.ErrNotExist)

// GetXattr implements p9.File. (p9 turns any xattr error into EINVAL.)
func (f *dotlFile) GetXattr(string) ([]byte, error) { return nil, dotlError(errNoXattr) }

// ListXattrs implements p9.File.
func (f *dotlFile) ListXattrs() ([]string, error) { return nil, dotlError(errNoXattr) }

// SetXattr implements p9.File.
func (f *dotlFile) SetXattr(string, []byte, p9.XattrFlags) error {
	return dotlError(fmt.Errorf("%w: extended attributes are fixed", fs.ErrPermission))
}

// RemoveXattr implements p9.File.
func (f *dotlFile) RemoveXattr(string) error {
	return dotlError(fmt.Errorf("%w: extended attributes are fixed", fs.ErrPermission))
}

// errFixedTree refuses every change to the shape of the tree.
var errFixedTree = fmt.Errorf("%w: files cannot be created, removed or renamed", fs.ErrPermission)

// noMutation is the default for every operation that would change the
// shape of the tree.
type noMutation struct{}

func (noMutation) Create(string, p9.OpenFlags, p9.FileMode, p9.UID, p9.GID) (p9.File, p9.QID, uint32, error) {
	return nil, p9.QID{}, 0, dotlError(errFixedTree)
}

func (noMutation) Mkdir(string, p9.FileMode, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, dotlError(errFixedTree)
}

func (noMutation) Symlink(string, string, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, dotlError(errFixedTree)
}

func (noMutation) Link(p9.File, string) error { return dotlError(errFixedTree) }

func (noMutation) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, dotlError(errFixedTree)
}

func (noMutation) Rename(p9.File, string) error           { return dotlError(errFixedTree) }
func (noMutation) RenameAt(string, p9.File, string) error { return dotlError(errFixedTree) }
func (noMutation) UnlinkAt(string, uint32) error          { return dotlError(errFixedTree) }

// dotlStream sits between a connection and hugelgupf/p9. It passes frames
// through, except that it
//   - answers Tauth itself with ENOENT (p9 answers ENOSYS, which makes
//     diod's tools fail; ENOENT tells them no authentication is needed);
//   - answers Txattrcreate itself with EOPNOTSUPP: p9 would keep every
//     byte of the Twrites that follow in memory until the clunk, up to a
//     size the client names (2^62 was taken), before fsrv is asked;
//   - answers a request of a type p9 does not decode with ENOSYS, and
//     Tgetlock (fcntl F_GETLK, which p9 does not decode) with F_UNLCK;
//   - caps or refuses the msize of a Tversion;
//   - answers a Twrite whose count disagrees with its size with EINVAL
//     on its tag (p9 answers on NOTAG), and ends a connection when p9
//     answers NOTAG for any other request it could not decode;
//   - corrects the QID of an Rattach for a Tattach with an aname: p9
//     walks aname but replies with the root's QID (attach(5): the QID of
//     the root of the tree aname names), and refuses an aname that names
//     a file with ENOTDIR;
//   - answers Tflush itself, right after the reply to the request it
//     names: p9's Tflush waits for the old tag, so a Tflush of its own tag
//     (or two that name each other) would never finish, and with it the
//     connection and Close. No request blocks, so there is nothing to
//     cancel.
type dotlStream struct {
	frameReader
	rwc      io.ReadWriteCloser
	maxMsize uint32
	msize    uint32 // frames larger than this are refused; read state

	// wmu serialises whole frames: p9 writes a frame in several Writes,
	// and a Tauth reply must not land in the middle of one.
	wmu  sync.Mutex
	wbuf []byte

	closeOnce sync.Once
	closeErr  error
	// ending, if set, is set at Close (session.ending).
	ending *atomic.Bool
	// sessMsize, if set, follows the negotiated msize (session.msize),
	// by which a ctl write tells a client's cut from a whole write.
	sessMsize *atomic.Uint32

	// again is the Tversion that ended p9's session, to start the next
	// one with; read state. draining is set from then until the next
	// session starts.
	again    []byte
	draining atomic.Bool

	// attachQID resolves the aname of a Tattach (dotlAttacher.attachQID).
	attachQID func(aname string) (p9.QID, error)

	// amu guards the QIDs to put in the Rattach of each Tattach with an
	// aname.
	amu      sync.Mutex
	attaches map[uint16]p9.QID
}

// dotlRequest reports whether hugelgupf/p9 decodes requests of type typ
// (its message registry), Tgetlock aside, which dotlStream answers.
func dotlRequest(typ uint8) bool {
	switch typ {
	case 8, 12, 14, 16, 18, 20, 22, 24, 26, 30, 32, 40, 50, 52, msgTgetlock, 70, 72, 74, 76,
		100, 102, 104, 108, 110, 116, 118, 120, 122, 126, 128, 130, 132, 134:
		return true
	}
	return false
}

const (
	msgTgetlock = 54
	msgRgetlock = 55
	// lockTypeUnlock is P9_LOCK_TYPE_UNLCK.
	lockTypeUnlock = 2

	msgTxattrcreate = 32
	msgTreaddir     = 40

	// treadBody is the body of a Tread or Treaddir: fid[4] offset[8]
	// count[4]; rreadHeader the bytes of an Rread before its data.
	treadBody   = 16
	rreadHeader = headerSize + 4

	msgTattach = 104
	msgRattach = 105
	msgTflush  = 108
	msgRflush  = 109
	msgTwrite  = 118

	// twriteFixed is the part of a Twrite before its data: fid[4]
	// offset[8] count[4].
	twriteFixed = 16

	// maxAttachFrame bounds the Tattach the stream reads whole to learn its
	// aname; a larger one (never sent: names are short) passes through.
	maxAttachFrame = 4096
)

func newDotlStream(rwc io.ReadWriteCloser, t *tracker, first []byte, msize, maxMsize uint32, attachQID func(string) (p9.QID, error)) *dotlStream {
	// The Tversion replayed from the sniffer is in flight like any other.
	t.start(frameTag(first), request{typ: msgTversion})
	return &dotlStream{
		frameReader: frameReader{r: bufio.NewReaderSize(rwc, 64<<10), t: t, pend: first},
		rwc:         rwc,
		maxMsize:    maxMsize,
		msize:       msize,
		attachQID:   attachQID,
		attaches:    make(map[uint16]p9.QID),
	}
}

// Read implements io.Reader for p9's receive loop.
func (s *dotlStream) Read(p []byte) (int, error) {
	return s.read(p, func() error {
		err := s.nextFrame()
		if err != nil && !errors.Is(err, errReversion) {
			// p9 closes the connection only once every request in its
			// hands is answered; a client that broke the protocol is
			// dropped now.
			s.t.close()
			s.rwc.Close()
		}
		return err
	})
}

// nextFrame reads the next frame header and either queues the frame for p9
// or handles it here.
func (s *dotlStream) nextFrame() error {
	hdr, typ, tag, body, err := s.header(s.msize)
	if err != nil {
		return err
	}
	size := headerSize + body
	defer s.wholeRead()
	var req request
	switch {
	case typ == msgTauth:
		if _, err := s.r.Discard(body); err != nil {
			return err
		}
		return s.inject(rlerror(tag, errno(errNoAuth)))
	case typ == msgTxattrcreate:
		// The tree has no extended attributes to set (SetXattr refuses
		// every one), so nothing is lost by refusing here, on every
		// listener, before p9 starts buffering the attribute's value.
		if _, err := s.r.Discard(body); err != nil {
			return err
		}
		return s.inject(rlerror(tag, linux.EOPNOTSUPP))
	case !dotlRequest(typ):
		// hugelgupf/p9 would answer on NOTAG, which ends the connection
		// (see Write): a 9P2000 Topen, plan9port's Topenfd or any other
		// type it does not decode is refused on its own tag instead.
		if _, err := s.r.Discard(body); err != nil {
			return err
		}
		return s.inject(rlerror(tag, linux.ENOSYS))
	case typ == msgTgetlock && size <= maxAttachFrame:
		// Linux sends Tgetlock for fcntl(F_GETLK), which p9 does not
		// decode. Every Tlock succeeds (there is nothing to lock), so no
		// lock ever conflicts: Rgetlock says F_UNLCK.
		frame, err := s.readWhole(hdr, body)
		if err != nil {
			return err
		}
		b := frame[headerSize:]
		if len(b) < 25+2 || len(b) != 25+2+int(binary.LittleEndian.Uint16(b[25:])) {
			return s.inject(rlerror(tag, linux.EINVAL))
		}
		r := append(newFrame(msgRgetlock, tag), lockTypeUnlock)
		r = append(r, b[5:]...) // start, length, proc_id, client_id
		return s.inject(finish(r))
	case typ == msgTversion && size <= maxVersionFrame:
		// A remount on the same stream sends a fresh Tversion.
		frame, t, err := s.readVersion(hdr, body)
		if err != nil {
			if frame == nil {
				return err
			}
			return s.inject(rlerror(tag, errno(err)))
		}
		// version(5): a Tversion inside a session (a remount on the same
		// stream) aborts the requests in flight and clunks every fid. p9
		// does neither, so its session ends here and a new one starts
		// with this Tversion (see reversion).
		s.again = versionFrame(msgTversion, t.tag, min(t.msize, s.maxMsize), t.version)
		s.draining.Store(true)
		return errReversion
	case typ == msgTwrite:
		// p9 answers a Twrite whose count disagrees with its size on
		// NOTAG, and the request's own tag never gets a reply.
		fixed, err := s.r.Peek(min(body, twriteFixed))
		if err != nil {
			return err
		}
		if body < twriteFixed || binary.LittleEndian.Uint32(fixed[12:]) != uint32(body-twriteFixed) {
			if _, err := s.r.Discard(body); err != nil {
				return err
			}
			return s.inject(rlerror(tag, errno(fs.ErrInvalid)))
		}
		req.typ = typ
	case (typ == msgTread || typ == msgTreaddir) && body == treadBody:
		// p9 slices its msize buffer by a Tread's count (a count past
		// msize panics in the handler, logged with its stack, and is
		// answered EFAULT) and sizes an Rreaddir by the count given; read(5)
		// lets the server return fewer bytes, so the count is cut to
		// what fits in one reply.
		frame, err := s.readWhole(hdr, body)
		if err != nil {
			return err
		}
		if most := s.msize - rreadHeader; binary.LittleEndian.Uint32(frame[headerSize+12:]) > most {
			binary.LittleEndian.PutUint32(frame[headerSize+12:], most)
		}
		if err := s.t.start(tag, request{typ: typ}); err != nil {
			return err
		}
		s.pend = frame
		return nil
	case typ == msgTflush:
		// Every Tflush is answered here: one that reached hugelgupf/p9 and
		// named its own tag would wait for itself forever. Bytes after the
		// old tag are ignored; a Tflush too short to name one ends the
		// connection.
		if body < 2 {
			return fmt.Errorf("%w: Tflush of %d bytes", errFrame, size)
		}
		var old [2]byte
		if _, err := io.ReadFull(s.r, old[:]); err != nil {
			return err
		}
		if _, err := s.r.Discard(body - 2); err != nil {
			return err
		}
		return s.flush(tag, binary.LittleEndian.Uint16(old[:]))
	case typ == msgTattach && size <= maxAttachFrame && s.attachQID != nil:
		frame, err := s.readWhole(hdr, body)
		if err != nil {
			return err
		}
		var qid p9.QID
		aname, ok := attachName(frame)
		if ok && aname != "" && aname != "/" {
			var err error
			qid, err = s.attachQID(aname)
			if errors.Is(err, errNotDir) {
				return s.inject(rlerror(tag, errno(err)))
			}
			ok = err == nil
		} else {
			ok = false
		}
		req := parseRequest(typ, frame[headerSize:], true)
		if s.reuses(req, frame[headerSize:]) {
			return s.inject(rlerror(tag, linux.EBADF))
		}
		if err := s.t.start(tag, req); err != nil {
			return err
		}
		if ok {
			s.amu.Lock()
			s.attaches[tag] = qid
			s.amu.Unlock()
		}
		s.pend = frame // p9 replies, errors included
		return nil
	default:
		b, err := s.r.Peek(min(body, fidPrefix))
		if err != nil {
			return err
		}
		req = parseRequest(typ, b, true)
		if s.reuses(req, b) {
			if _, err := s.r.Discard(body); err != nil {
				return err
			}
			return s.inject(rlerror(tag, linux.EBADF))
		}
	}
	err = s.pass(hdr, body, req)
	if errors.Is(err, errTooManyFids) {
		return s.inject(rlerror(tag, errno(err)))
	}
	return err
}

// reuses reports whether req would make a fid the connection holds
// already: hugelgupf/p9 would replace it, where attach(5) and walk(5) say
// the new fid must not be in use (a walk to itself is a walk in place).
func (s *dotlStream) reuses(req request, body []byte) bool {
	if !req.makes || !s.t.fidInUse(req.newfid) {
		return false
	}
	if req.typ != msgTattach && len(body) >= 4 && binary.LittleEndian.Uint32(body) == req.newfid {
		return false
	}
	return true
}

// attachName returns the aname of a whole Tattach frame: fid[4] afid[4]
// uname[s] aname[s] n_uname[4].
func attachName(frame []byte) (string, bool) {
	b := frame[headerSize:]
	if len(b) < 10 {
		return "", false
	}
	b = b[8:]
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n+2 {
		return "", false
	}
	b = b[2+n:]
	n = int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n {
		return "", false
	}
	return string(b[2 : 2+n]), true
}

// fixAttach puts the attached directory's QID in the Rattach that answers
// tag, if the Tattach had an aname; any reply to tag ends the wait.
func (s *dotlStream) fixAttach(frame []byte) {
	tag := frameTag(frame)
	s.amu.Lock()
	q, ok := s.attaches[tag]
	delete(s.attaches, tag)
	s.amu.Unlock()
	if !ok || frame[4] != msgRattach || len(frame) < headerSize+13 {
		return
	}
	b := frame[headerSize:]
	b[0] = uint8(q.Type)
	binary.LittleEndian.PutUint32(b[1:], q.Version)
	binary.LittleEndian.PutUint64(b[5:], q.Path)
}

// flush answers Tflush tag: after the reply to oldtag if that request is
// still in p9's hands, at once otherwise.
func (s *dotlStream) flush(tag, oldtag uint16) error {
	later, err := s.t.startFlush(tag, oldtag)
	if err != nil || later {
		return err
	}
	return s.inject(finish(newFrame(msgRflush, tag)))
}

// errUndecodable ends a connection that sent a request p9 could not decode.
var errUndecodable = fmt.Errorf("%w: a request that could not be decoded", errFrame)

// inject writes a whole frame between p9's frames.
func (s *dotlStream) inject(frame []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.rwc.Write(frame)
	return err
}

// Write implements io.Writer for p9's send path: it gathers the pieces of
// a frame and writes each whole frame at once.
func (s *dotlStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.draining.Load() {
		// The replies to requests a Tversion aborted are not sent.
		s.wbuf = s.wbuf[:0]
		return len(p), nil
	}
	s.wbuf = append(s.wbuf, p...)
	for len(s.wbuf) >= 4 {
		size := int(binary.LittleEndian.Uint32(s.wbuf))
		if size < headerSize {
			return 0, errFrame
		}
		if len(s.wbuf) < size {
			break
		}
		frame := s.wbuf[:size]
		if frameTag(frame) == noTag && frame[4] == msgRlerror && !s.t.pending(noTag) {
			// p9 could not decode a request and answered NOTAG; the
			// request's own tag will never get a reply, so the client
			// would wait forever. End the connection instead.
			s.t.close()
			s.rwc.Close()
			return 0, errUndecodable
		}
		s.fixAttach(frame)
		if flushes := s.t.finish(frame); len(flushes) > 0 {
			// A copy: the bytes after frame in wbuf are the next frame's.
			frame = frame[:len(frame):len(frame)]
			for _, f := range flushes {
				frame = append(frame, finish(newFrame(msgRflush, f))...)
			}
		}
		if _, err := s.rwc.Write(frame); err != nil {
			return 0, err
		}
		s.wbuf = s.wbuf[:copy(s.wbuf, s.wbuf[size:])]
	}
	if cap(s.wbuf) > 1<<20 && len(s.wbuf) == 0 {
		s.wbuf = nil // do not keep a large buffer for an idle connection
	}
	return len(p), nil
}

// reversion readies the stream for a new p9 session after a Tversion
// ended the last one (again): it starts with that Tversion, no fid and no
// request in flight. The caller has waited for the old session to end.
func (s *dotlStream) reversion() {
	frame := s.again
	s.again = nil
	s.t.reset()
	s.t.start(frameTag(frame), request{typ: msgTversion})
	s.msize = binary.LittleEndian.Uint32(frame[headerSize:])
	if s.sessMsize != nil {
		s.sessMsize.Store(s.msize)
	}
	if s.ending != nil {
		s.ending.Store(false)
	}
	s.wmu.Lock()
	s.wbuf = s.wbuf[:0]
	s.draining.Store(false)
	s.wmu.Unlock()
	s.pend = frame
}

// Close closes the connection; p9 closes both its reader and its writer,
// once every request is answered and before it drops the fids. At a
// Tversion inside the session the connection stays open for the next.
func (s *dotlStream) Close() error {
	if s.ending != nil {
		s.ending.Store(true)
	}
	if s.draining.Load() {
		return nil
	}
	s.closeOnce.Do(func() { s.closeErr = s.rwc.Close() })
	if errors.Is(s.closeErr, fs.ErrClosed) {
		return nil
	}
	return s.closeErr
}
