package fsrv

import (
	"errors"
	"io/fs"
	"strings"
	"unicode/utf8"

	"github.com/hugelgupf/p9/linux"
)

// Sentinels that callbacks wrap (with %w) besides fs.ErrInvalid,
// fs.ErrPermission and fs.ErrNotExist. This file is the only place where
// Go errors become 9P errors.
var (
	// ErrBusy: the command cannot run now (EBUSY; "busy: ..." under 9P2000).
	ErrBusy = errors.New("busy")
	// ErrTooLarge: a write is over a size limit (EFBIG under 9P2000.L;
	// "invalid argument: write too large: ..." under 9P2000, since 9pfuse
	// has no word for EFBIG).
	ErrTooLarge = errors.New("write too large")

	// errNotDir: an attach names a file (ENOTDIR).
	errNotDir = errors.New("not a directory")
)

// errKind is how one class of error travels in each dialect.
type errKind struct {
	sentinel error
	errno    linux.Errno // 9P2000.L
	// word starts a 9P2000 error string; plan9port's 9pfuse maps it to
	// errno (see fuseErrno).
	word string
	// bare is sent when there is no detail, or when the detail would make
	// 9pfuse pick another errno. It is also an exact entry of the Linux
	// kernel's table (net/9p/error.c), which a version=9p2000 mount
	// matches whole, so that walks and opens map right there too.
	bare string
	// keep the sentinel's text in the detail (ErrTooLarge would otherwise
	// lose what it means behind the word "invalid argument").
	keep bool
}

var (
	kindInvalid  = errKind{fs.ErrInvalid, linux.EINVAL, "invalid argument", "Invalid argument", false}
	kindPerm     = errKind{fs.ErrPermission, linux.EACCES, "permission denied", "permission denied", false}
	kindNotExist = errKind{fs.ErrNotExist, linux.ENOENT, "file not found", "file not found", false}
	kindBusy     = errKind{ErrBusy, linux.EBUSY, "busy", "Device or resource busy", false}
	kindTooLarge = errKind{ErrTooLarge, linux.EFBIG, "invalid argument", "Invalid argument", true}
	kindNotDir   = errKind{errNotDir, linux.ENOTDIR, "not a directory", "Not a directory", false}
	kindTooMany  = errKind{errTooManyFids, linux.EMFILE, "too many open files", "Too many open files", false}
	kindIO       = errKind{nil, linux.EIO, "i/o error", "i/o error", false}
)

// classify finds the kind of err; the first sentinel it wraps wins.
func classify(err error) errKind {
	for _, k := range []errKind{kindTooLarge, kindBusy, kindInvalid, kindPerm, kindNotExist, kindNotDir, kindTooMany} {
		if errors.Is(err, k.sentinel) {
			return k
		}
	}
	return kindIO
}

// errno converts err for a 9P2000.L reply.
func errno(err error) linux.Errno {
	if err == nil {
		return 0
	}
	return classify(err).errno
}

// dotlError is errno as an error, as p9.File methods return it.
func dotlError(err error) error {
	if err == nil {
		return nil
	}
	return errno(err)
}

// plan9Error is a 9P2000 error string; srv9p sends err.Error() verbatim.
type plan9Error string

func (e plan9Error) Error() string { return string(e) }

// ename converts err for a 9P2000 Rerror: "word: detail", where the word is
// one that plan9port's 9pfuse maps to the right errno.
func ename(err error) string {
	k := classify(err)
	msg := err.Error()
	detail := msg
	if k.sentinel != nil && !k.keep {
		s := k.sentinel.Error()
		switch {
		case msg == s:
			detail = ""
		case strings.HasPrefix(msg, s+": "):
			detail = msg[len(s)+2:]
		case strings.HasSuffix(msg, ": "+s):
			detail = msg[:len(msg)-len(s)-2]
		}
	}
	if detail == "" || detail == k.word {
		return k.bare
	}
	e := k.word + ": " + detail
	if fuseErrno(e) != fuseErrno(k.bare) {
		// 9pfuse takes the first word of its table found anywhere in the
		// string, so a detail such as "shard 9 does not exist" would turn
		// EINVAL into ENOENT. The errno matters more than the detail.
		return k.bare
	}
	return e
}

// plan9Err is ename as an error, as srv9p callbacks return it.
func plan9Err(err error) error {
	if err == nil {
		return nil
	}
	return plan9Error(ename(err))
}

// fuseErrorTable is plan9port's 9pfuse errstr2errno table
// (src/cmd/9pfuse/errstr.c) in its order: the first text found anywhere in
// the error string, ignoring case, gives the errno, and no match gives
// ERANGE.
var fuseErrorTable = []struct {
	text  string
	errno linux.Errno
}{
	{"permitted", linux.EPERM},
	{"permission", linux.EACCES},
	{"access", linux.EACCES},
	{"exists", linux.EEXIST},
	{"exist", linux.ENOENT},
	{"no such", linux.ENOENT},
	{"not found", linux.ENOENT},
	{"input/output", linux.EIO},
	{"timeout", linux.ETIMEDOUT},
	{"timed out", linux.ETIMEDOUT},
	{"i/o", linux.EIO},
	{"too long", linux.E2BIG},
	{"interrupt", linux.EINTR},
	{"no such", linux.ENODEV},
	{"bad file", linux.EBADF},
	{" fid ", linux.EBADF},
	{"temporar", linux.EAGAIN},
	{"memory", linux.ENOMEM},
	{"is a directory", linux.EISDIR},
	{"directory", linux.ENOTDIR},
	{"argument", linux.EINVAL},
	{"pipe", linux.EPIPE},
	{"in use", linux.EBUSY},
	{"busy", linux.EBUSY},
	{"illegal", linux.EINVAL},
	{"read-only", linux.EROFS},
	{"read only", linux.EROFS},
	{"proto", linux.EPROTO},
	{"entry", linux.ENOENT},
}

// fuseErrno is the errno 9pfuse gives a 9P2000 error string.
func fuseErrno(s string) linux.Errno {
	s = strings.ToLower(s)
	for _, e := range fuseErrorTable {
		if strings.Contains(s, e.text) {
			return e.errno
		}
	}
	return linux.ERANGE
}

// rerrorOverhead is what an Rerror adds to its string: size[4] type[1]
// tag[2] and the string's length[2].
const rerrorOverhead = headerSize + 2

// errMax is Plan 9's ERRMAX: an error string of 128 bytes with its NUL.
// plan9port's library (9pfuse, 9p) and Plan 9's kernel cut a longer one,
// so the word and the detail's start, which say what went wrong, come
// first and the rest is clipped here.
const errMax = 128

// clipEname shortens a 9P2000 error string to errMax-1 bytes and so that
// its Rerror fits msize: srv9p drops a reply larger than msize, and the
// client then waits for it forever. A clipped string ends in "...", cut
// at a rune boundary.
func clipEname(e string, msize uint32) string {
	limit := min(int(msize)-rerrorOverhead, errMax-1)
	if len(e) <= limit {
		return e
	}
	if limit < 3 {
		return ""
	}
	cut := limit - 3
	for cut > 0 && !utf8.RuneStart(e[cut]) {
		cut--
	}
	return e[:cut] + "..."
}
