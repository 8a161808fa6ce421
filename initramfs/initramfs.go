// Package initramfs writes the root file system a Linux guest or a
// netbooted node unpacks: a table of entries written in order as a gzipped
// newc cpio archive (u-root's cpio package does the format). Two callers
// use it: baremetal, for the images `shardfs netboot` writes, and the
// integration tests, for the QEMU guests. Entries carry no times and root
// as their owner, so the same table gives the same bytes.
package initramfs

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// An Image is a table of entries, written in order. Its String is the plan
// (what goes where); WriteTo writes the archive. The methods that add an
// entry add its missing parent directories (0755) first.
type Image struct {
	Files []File
	// Level is the gzip level; zero means gzip.BestSpeed, what a test
	// guest built on every run wants. A shipped image asks for
	// gzip.BestCompression.
	Level int
}

// File is one entry of an Image. Exactly one of the kinds applies: a
// directory, a regular file (From a host file, or Data), a symbolic link
// (Target), or a character device (Major, Minor).
type File struct {
	Path string // in the image, without the leading slash
	Kind Kind
	Mode uint32 // permission bits
	From string // host file whose content is copied, for a regular file
	Data []byte // content of a regular file when From is empty

	Target       string // symbolic link target
	Major, Minor uint32 // character device number
}

// Kind says what an Image entry is.
type Kind uint8

// The kinds of entries.
const (
	KindDir Kind = iota
	KindFile
	KindSymlink
	KindCharDev
)

func (f File) String() string {
	switch f.Kind {
	case KindDir:
		return fmt.Sprintf("dir     %04o /%s", f.Mode, f.Path)
	case KindSymlink:
		return fmt.Sprintf("symlink      /%s -> %s", f.Path, f.Target)
	case KindCharDev:
		return fmt.Sprintf("chardev %04o /%s %d:%d", f.Mode, f.Path, f.Major, f.Minor)
	}
	if f.From != "" {
		return fmt.Sprintf("file    %04o /%s < %s", f.Mode, f.Path, f.From)
	}
	return fmt.Sprintf("file    %04o /%s (%d bytes)", f.Mode, f.Path, len(f.Data))
}

// String lists the entries, one a line.
func (im *Image) String() string {
	var b strings.Builder
	for _, f := range im.Files {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Clean is p as an entry's path: cleaned, without the leading slash.
func Clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// Has reports whether the image already has an entry at p.
func (im *Image) Has(p string) bool {
	p = Clean(p)
	for _, f := range im.Files {
		if f.Path == p {
			return true
		}
	}
	return false
}

func (im *Image) add(f File) {
	f.Path = Clean(f.Path)
	im.Dir(path.Dir(f.Path), 0o755)
	im.Files = append(im.Files, f)
}

// Dir adds a directory with the given mode, and its missing parents
// (0755), unless present.
func (im *Image) Dir(p string, mode uint32) {
	p = Clean(p)
	if p == "" || im.Has(p) {
		return
	}
	im.Dir(path.Dir(p), 0o755)
	im.Files = append(im.Files, File{Path: p, Kind: KindDir, Mode: mode})
}

// Copy adds a regular file whose content is the host file from, read when
// the image is written.
func (im *Image) Copy(p, from string, mode uint32) {
	im.add(File{Path: p, Kind: KindFile, Mode: mode, From: from})
}

// Text adds a regular file with the given content.
func (im *Image) Text(p string, data []byte, mode uint32) {
	im.add(File{Path: p, Kind: KindFile, Mode: mode, Data: data})
}

// Symlink adds a symbolic link.
func (im *Image) Symlink(p, target string) {
	im.add(File{Path: p, Kind: KindSymlink, Mode: 0o777, Target: target})
}

// CharDev adds a character device node. The kernel creates it while
// unpacking, so the system has it before any devtmpfs is mounted (init
// needs /dev/console for its standard streams).
func (im *Image) CharDev(p string, mode, major, minor uint32) {
	im.add(File{Path: p, Kind: KindCharDev, Mode: mode, Major: major, Minor: minor})
}

// WriteTo writes the image as a gzipped newc cpio archive. Several such
// archives, concatenated, unpack as one (as iPXE hands them over).
func (im *Image) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	level := im.Level
	if level == 0 {
		level = gzip.BestSpeed
	}
	gz, err := gzip.NewWriterLevel(cw, level)
	if err != nil {
		return 0, fmt.Errorf("initramfs: %w", err)
	}
	rw := cpio.Newc.Writer(gz)
	for i, f := range im.Files {
		info := cpio.Info{Name: f.Path, Ino: uint64(i + 1), NLink: 1, Mode: uint64(f.Mode) & 0o7777}
		var data []byte
		switch f.Kind {
		case KindDir:
			info.Mode |= cpio.S_IFDIR
			info.NLink = 2
		case KindSymlink:
			info.Mode |= cpio.S_IFLNK
			data = []byte(f.Target)
		case KindCharDev:
			info.Mode |= cpio.S_IFCHR
			info.Rmajor, info.Rminor = uint64(f.Major), uint64(f.Minor)
		case KindFile:
			info.Mode |= cpio.S_IFREG
			data = f.Data
			if f.From != "" {
				if data, err = os.ReadFile(f.From); err != nil {
					return cw.n, fmt.Errorf("initramfs: entry /%s: %w", f.Path, err)
				}
			}
		default:
			return cw.n, fmt.Errorf("initramfs: entry /%s: unknown kind %d", f.Path, f.Kind)
		}
		if err := rw.WriteRecord(cpio.StaticRecord(data, info)); err != nil {
			return cw.n, fmt.Errorf("initramfs: entry /%s: %w", f.Path, err)
		}
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return cw.n, err
	}
	err = gz.Close()
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
