package fsrv

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hugelgupf/p9/linux"
)

// linuxErrors is the part of the Linux kernel's 9P2000 table
// (net/9p/error.c) fsrv relies on: a version=9p2000 mount matches the
// whole string.
var linuxErrors = map[string]linux.Errno{
	"Invalid argument":        linux.EINVAL,
	"permission denied":       linux.EACCES,
	"file not found":          linux.ENOENT,
	"Device or resource busy": linux.EBUSY,
	"i/o error":               linux.EIO,
	"Not a directory":         linux.ENOTDIR,
}

func TestErrorConversion(t *testing.T) {
	tests := []struct {
		err   error
		errno linux.Errno
		ename string
	}{
		{fmt.Errorf("%w: unknown command %q", fs.ErrInvalid, "frob"), linux.EINVAL, `invalid argument: unknown command "frob"`},
		{fmt.Errorf("unknown command %q: %w", "frob", fs.ErrInvalid), linux.EINVAL, `invalid argument: unknown command "frob"`},
		{fs.ErrInvalid, linux.EINVAL, "Invalid argument"},
		{fmt.Errorf("%w: status is read-only", fs.ErrPermission), linux.EACCES, "permission denied: status is read-only"},
		{fs.ErrPermission, linux.EACCES, "permission denied"},
		{fs.ErrNotExist, linux.ENOENT, "file not found"},
		{fmt.Errorf("%w: shard 9", fs.ErrNotExist), linux.ENOENT, "file not found: shard 9"},
		{fmt.Errorf("%w: shard 3 is starting", ErrBusy), linux.EBUSY, "busy: shard 3 is starting"},
		{ErrBusy, linux.EBUSY, "Device or resource busy"},
		{fmt.Errorf("%w: 70000 bytes", ErrTooLarge), linux.EFBIG, "invalid argument: write too large: 70000 bytes"},
		{errors.New("disk on fire"), linux.EIO, "i/o error: disk on fire"},
		{fmt.Errorf("wrapped: %w", fmt.Errorf("%w: x", ErrBusy)), linux.EBUSY, "busy: wrapped: busy: x"},
		// A detail with a word 9pfuse would match first loses to the errno.
		{fmt.Errorf("%w: shard 9 does not exist", fs.ErrInvalid), linux.EINVAL, "Invalid argument"},
		{fmt.Errorf("%w: no such directory", ErrBusy), linux.EBUSY, "Device or resource busy"},
		{fmt.Errorf("%w: ctl", errNotDir), linux.ENOTDIR, "not a directory: ctl"},
		{errNotDir, linux.ENOTDIR, "Not a directory"},
	}
	for _, tt := range tests {
		if got := errno(tt.err); got != tt.errno {
			t.Errorf("errno(%v) = %v; want %v", tt.err, got, tt.errno)
		}
		got := ename(tt.err)
		if got != tt.ename {
			t.Errorf("ename(%v) = %q; want %q", tt.err, got, tt.ename)
		}
		if e := fuseErrno(got); e != tt.errno && !(tt.errno == linux.EFBIG && e == linux.EINVAL) {
			t.Errorf("9pfuse maps %q to %v; want %v", got, e, tt.errno)
		}
	}
	for s, want := range linuxErrors {
		if got := fuseErrno(s); got != want {
			t.Errorf("9pfuse maps the bare %q to %v; want %v as Linux does", s, got, want)
		}
	}
	for _, k := range []errKind{kindInvalid, kindPerm, kindNotExist, kindBusy, kindNotDir, kindIO} {
		if _, ok := linuxErrors[k.bare]; !ok {
			t.Errorf("bare string %q is not in the Linux kernel's table", k.bare)
		}
	}
}

func TestClipEname(t *testing.T) {
	tests := []struct {
		in    string
		msize uint32
		want  string
	}{
		{"short", 256, "short"},
		// ERRMAX (128 bytes with the NUL) bounds every msize: plan9port
		// and Plan 9 cut a longer string.
		{strings.Repeat("a", 127), 256, strings.Repeat("a", 127)},
		{strings.Repeat("a", 128), 256, strings.Repeat("a", 124) + "..."},
		{strings.Repeat("a", 300), 8192, strings.Repeat("a", 124) + "..."},
		// A cut inside a rune moves back to its start.
		{strings.Repeat("a", 123) + "é" + strings.Repeat("b", 10), 8192, strings.Repeat("a", 123) + "..."},
	}
	for _, tt := range tests {
		got := clipEname(tt.in, tt.msize)
		if got != tt.want || len(got)+rerrorOverhead > int(tt.msize) || len(got) >= errMax || !utf8.ValidString(got) {
			t.Errorf("clipEname(%d bytes, %d) = %q; want %q", len(tt.in), tt.msize, got, tt.want)
		}
	}
}
