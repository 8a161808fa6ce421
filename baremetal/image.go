package baremetal

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// An Archive is an initramfs as a table of entries, written in order. Its
// String is the plan; WriteTo writes it as a gzipped newc cpio archive,
// which Linux unpacks (several, concatenated, as iPXE hands them over).
type Archive struct {
	Entries []Entry
}

// Entry is one file of an Archive: a directory, a regular file (From a
// host file, or Data) or a character device (Major, Minor).
type Entry struct {
	Path         string // without the leading slash
	Kind         EntryKind
	Mode         uint32 // permission bits
	From         string
	Data         []byte
	Major, Minor uint32
}

// EntryKind says what an Entry is.
type EntryKind uint8

// The kinds of entries.
const (
	EntryDir EntryKind = iota
	EntryFile
	EntryCharDev
)

func (e Entry) String() string {
	switch e.Kind {
	case EntryDir:
		return fmt.Sprintf("dir     %04o /%s", e.Mode, e.Path)
	case EntryCharDev:
		return fmt.Sprintf("chardev %04o /%s %d:%d", e.Mode, e.Path, e.Major, e.Minor)
	}
	if e.From != "" {
		return fmt.Sprintf("file    %04o /%s < %s", e.Mode, e.Path, e.From)
	}
	return fmt.Sprintf("file    %04o /%s (%d bytes)", e.Mode, e.Path, len(e.Data))
}

func (a *Archive) String() string {
	var b strings.Builder
	for _, e := range a.Entries {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func (a *Archive) has(p string) bool {
	for _, e := range a.Entries {
		if e.Path == p {
			return true
		}
	}
	return false
}

// Dir adds a directory and its missing parents (mode 0755).
func (a *Archive) Dir(p string, mode uint32) {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" || a.has(p) {
		return
	}
	a.Dir(path.Dir(p), 0o755)
	a.Entries = append(a.Entries, Entry{Path: p, Kind: EntryDir, Mode: mode})
}

func (a *Archive) add(e Entry) {
	e.Path = strings.TrimPrefix(path.Clean("/"+e.Path), "/")
	a.Dir(path.Dir(e.Path), 0o755)
	a.Entries = append(a.Entries, e)
}

// File adds a regular file read from the host file from when written.
func (a *Archive) File(p, from string, mode uint32) {
	a.add(Entry{Path: p, Kind: EntryFile, Mode: mode, From: from})
}

// Text adds a regular file with the given content.
func (a *Archive) Text(p string, data []byte, mode uint32) {
	a.add(Entry{Path: p, Kind: EntryFile, Mode: mode, Data: data})
}

// CharDev adds a character device. The kernel opens /dev/console for
// init's standard streams before init can mount devtmpfs, so the archive
// must carry it.
func (a *Archive) CharDev(p string, mode, major, minor uint32) {
	a.add(Entry{Path: p, Kind: EntryCharDev, Mode: mode, Major: major, Minor: minor})
}

// WriteTo writes the archive, gzipped. Entries carry no times and root as
// their owner, so the same table gives the same bytes.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	gz, _ := gzip.NewWriterLevel(cw, gzip.BestCompression)
	rw := cpio.Newc.Writer(gz)
	for i, e := range a.Entries {
		info := cpio.Info{Name: e.Path, Ino: uint64(i + 1), NLink: 1, Mode: uint64(e.Mode) & 0o7777}
		var data []byte
		switch e.Kind {
		case EntryDir:
			info.Mode |= cpio.S_IFDIR
			info.NLink = 2
		case EntryCharDev:
			info.Mode |= cpio.S_IFCHR
			info.Rmajor, info.Rminor = uint64(e.Major), uint64(e.Minor)
		case EntryFile:
			info.Mode |= cpio.S_IFREG
			data = e.Data
			if e.From != "" {
				var err error
				if data, err = os.ReadFile(e.From); err != nil {
					return cw.n, fmt.Errorf("archive entry /%s: %w", e.Path, err)
				}
			}
		default:
			return cw.n, fmt.Errorf("archive entry /%s: unknown kind %d", e.Path, e.Kind)
		}
		if err := rw.WriteRecord(cpio.StaticRecord(data, info)); err != nil {
			return cw.n, fmt.Errorf("archive entry /%s: %w", e.Path, err)
		}
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return cw.n, err
	}
	err := gz.Close()
	return cw.n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
