package initramfs

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

func TestImage(t *testing.T) {
	host := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(host, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	im := &Image{}
	im.CharDev("dev/console", 0o600, 5, 1)
	im.Text("/init", []byte("#!/bin/sh\n"), 0o755)
	im.Copy("usr/share/hello", host, 0o644)
	im.Symlink("bin/sh", "busybox")
	im.Dir("usr/share", 0o755) // already there: no second entry

	wantPlan := strings.Join([]string{
		"dir     0755 /dev",
		"chardev 0600 /dev/console 5:1",
		"file    0755 /init (10 bytes)",
		"dir     0755 /usr",
		"dir     0755 /usr/share",
		"file    0644 /usr/share/hello < " + host,
		"dir     0755 /bin",
		"symlink      /bin/sh -> busybox",
	}, "\n") + "\n"
	if got := im.String(); got != wantPlan {
		t.Errorf("String() =\n%s\nwant\n%s", got, wantPlan)
	}

	var buf bytes.Buffer
	n, err := im.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo = %d, %v; want %d, nil", n, err, buf.Len())
	}
	var again bytes.Buffer
	if _, err := im.WriteTo(&again); err != nil || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Errorf("WriteTo twice gave different bytes (%v)", err)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name    string
		mode    uint64
		content string
		dev     [2]uint64
	}
	var got []entry
	for _, r := range recs {
		var content []byte
		if r.ReaderAt != nil {
			content, _ = io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
		}
		got = append(got, entry{r.Name, r.Mode, string(content), [2]uint64{r.Rmajor, r.Rminor}})
	}
	want := []entry{
		{"dev", cpio.S_IFDIR | 0o755, "", [2]uint64{}},
		{"dev/console", cpio.S_IFCHR | 0o600, "", [2]uint64{5, 1}},
		{"init", cpio.S_IFREG | 0o755, "#!/bin/sh\n", [2]uint64{}},
		{"usr", cpio.S_IFDIR | 0o755, "", [2]uint64{}},
		{"usr/share", cpio.S_IFDIR | 0o755, "", [2]uint64{}},
		{"usr/share/hello", cpio.S_IFREG | 0o644, "hello\n", [2]uint64{}},
		{"bin", cpio.S_IFDIR | 0o755, "", [2]uint64{}},
		{"bin/sh", cpio.S_IFLNK | 0o777, "busybox", [2]uint64{}},
	}
	if !bytes.Contains(raw, []byte(cpio.Trailer)) {
		t.Error("the archive has no trailer")
	}
	if len(got) != len(want) {
		t.Fatalf("archive has %d records; want %d:\n%v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d = %+v; want %+v", i, got[i], want[i])
		}
	}
}

func TestImageMissingHostFile(t *testing.T) {
	im := &Image{}
	im.Copy("x", filepath.Join(t.TempDir(), "nonexistent"), 0o644)
	if _, err := im.WriteTo(io.Discard); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteTo with a missing host file = %v; want ErrNotExist", err)
	}
}
