package integration

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// An Image is the root file system of a guest: a table of entries, written
// in order. Its String is the plan (what goes where); WriteTo writes it as
// a gzipped newc cpio archive, the initramfs format Linux unpacks. The
// methods that add an entry add its missing parent directories first.
type Image struct {
	Files []File
}

// File is one entry of an Image. Exactly one of the kinds applies: a
// directory, a regular file (From a host file, or Data), a symbolic link
// (Target), or a character device (Major, Minor).
type File struct {
	Path string // in the guest, without the leading slash
	Kind FileKind
	Mode uint32 // permission bits
	From string // host file whose content is copied, for a regular file
	Data []byte // content of a regular file when From is empty

	Target       string // symbolic link target
	Major, Minor uint32 // character device number
}

// FileKind says what an Image entry is.
type FileKind uint8

// The kinds of entries.
const (
	KindDir FileKind = iota
	KindFile
	KindSymlink
	KindCharDev
)

func (f File) String() string {
	switch f.Kind {
	case KindDir:
		return fmt.Sprintf("dir     %04o %s", f.Mode, f.Path)
	case KindSymlink:
		return fmt.Sprintf("symlink      %s -> %s", f.Path, f.Target)
	case KindCharDev:
		return fmt.Sprintf("chardev %04o %s %d:%d", f.Mode, f.Path, f.Major, f.Minor)
	}
	if f.From != "" {
		return fmt.Sprintf("file    %04o %s < %s", f.Mode, f.Path, f.From)
	}
	return fmt.Sprintf("file    %04o %s (%d bytes)", f.Mode, f.Path, len(f.Data))
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

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// has reports whether the image already has an entry at p.
func (im *Image) has(p string) bool {
	for _, f := range im.Files {
		if f.Path == p {
			return true
		}
	}
	return false
}

func (im *Image) add(f File) {
	f.Path = clean(f.Path)
	im.Dir(path.Dir(f.Path))
	im.Files = append(im.Files, f)
}

// Dir adds a directory (mode 0755) and its parents, unless present.
func (im *Image) Dir(p string) {
	p = clean(p)
	if p == "" || im.has(p) {
		return
	}
	im.Dir(path.Dir(p))
	im.Files = append(im.Files, File{Path: p, Kind: KindDir, Mode: 0o755})
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
// unpacking, so the guest has it before any devtmpfs is mounted (init
// needs /dev/console for its standard streams).
func (im *Image) CharDev(p string, mode, major, minor uint32) {
	im.add(File{Path: p, Kind: KindCharDev, Mode: mode, Major: major, Minor: minor})
}

// WriteTo writes the image as a gzipped newc cpio archive. Entries carry
// no times and no owners, so the same table gives the same bytes.
func (im *Image) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	gz, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed)
	rw := cpio.Newc.Writer(gz)
	for i, f := range im.Files {
		info := cpio.Info{Name: f.Path, Ino: uint64(i + 1), NLink: 1, Mode: uint64(f.Mode) & 0o7777}
		var rec cpio.Record
		switch f.Kind {
		case KindDir:
			info.Mode |= cpio.S_IFDIR
			info.NLink = 2
			rec = cpio.StaticRecord(nil, info)
		case KindSymlink:
			info.Mode |= cpio.S_IFLNK
			rec = cpio.StaticRecord([]byte(f.Target), info)
		case KindCharDev:
			info.Mode |= cpio.S_IFCHR
			info.Rmajor, info.Rminor = uint64(f.Major), uint64(f.Minor)
			rec = cpio.StaticRecord(nil, info)
		case KindFile:
			info.Mode |= cpio.S_IFREG
			data := f.Data
			if f.From != "" {
				var err error
				if data, err = os.ReadFile(f.From); err != nil {
					return cw.n, fmt.Errorf("integration: image entry %s: %w", f.Path, err)
				}
			}
			rec = cpio.StaticRecord(data, info)
		default:
			return cw.n, fmt.Errorf("integration: image entry %s: unknown kind %d", f.Path, f.Kind)
		}
		if err := rw.WriteRecord(rec); err != nil {
			return cw.n, fmt.Errorf("integration: image entry %s: %w", f.Path, err)
		}
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return cw.n, err
	}
	if err := gz.Close(); err != nil {
		return cw.n, err
	}
	return cw.n, nil
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

// AddBusybox adds a static busybox as /bin/busybox with a symbolic link for
// each of its applets, where busybox --list-full says it belongs.
func (im *Image) AddBusybox(busybox string) error {
	out, err := execOutput(busybox, "--list-full")
	if err != nil {
		return fmt.Errorf("integration: listing busybox applets: %w", err)
	}
	im.Copy("bin/busybox", busybox, 0o755)
	for _, applet := range strings.Fields(out) {
		applet = clean(applet)
		if applet == "bin/busybox" || im.has(applet) {
			continue
		}
		// A relative target works wherever the link lives.
		rel := strings.Repeat("../", strings.Count(applet, "/")) + "bin/busybox"
		im.Symlink(applet, rel)
	}
	return nil
}

// AddModules adds kernel modules from the kit as /lib/modules/NAME.ko and
// lists them, in load order, in /etc/modules for the guest to insmod.
func (im *Image) AddModules(k *Kit, names ...string) error {
	var list strings.Builder
	for _, n := range names {
		p, err := k.Module(n)
		if err != nil {
			return err
		}
		im.Copy("lib/modules/"+n+".ko", p, 0o644)
		list.WriteString(n + "\n")
	}
	im.Text("etc/modules", []byte(list.String()), 0o644)
	return nil
}
