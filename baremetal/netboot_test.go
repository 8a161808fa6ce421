package baremetal

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

// readArchive lists a written archive: path → mode (type bits included),
// and the content of its regular files.
func readArchive(t *testing.T, file string) (map[string]uint64, map[string]string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(gz)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	modes, data := map[string]uint64{}, map[string]string{}
	for _, r := range recs {
		modes[r.Name] = r.Mode
		if r.Mode&cpio.S_IFMT == cpio.S_IFREG {
			b, _ := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
			data[r.Name] = string(b)
		}
	}
	return modes, data
}

func TestNetbootWrite(t *testing.T) {
	dir := t.TempDir()
	src := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nb := Netboot{
		Init:     src("shardfs", "ELF-ish"),
		Modules:  []KernelModule{{Name: "virtio", Path: src("virtio.ko", "mod1")}, {Name: "virtio_net", Path: src("virtio_net.ko", "mod2")}},
		Cmdline:  "shardfs.flavor=discord shardfs.total=1",
		EnrollCA: src("enroll-ca.crt", "ENROLL-CA"),
		CABundle: src("bundle.pem", "BUNDLE"),
	}
	out := filepath.Join(dir, "out")
	sizes, err := nb.Write(out)
	if err != nil {
		t.Fatal(err)
	}
	wantModes := map[string]os.FileMode{BootScript: 0o644, InitrdFile: 0o644}
	for name, mode := range wantModes {
		fi, err := os.Stat(filepath.Join(out, name))
		if err != nil || fi.Mode().Perm() != mode || fi.Size() != sizes[name] {
			t.Errorf("%s: %v, %v; want mode %04o and size %d", name, fi, err, mode, sizes[name])
		}
	}
	if _, err := os.Stat(filepath.Join(out, KernelFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("vmlinuz written without a kernel: %v", err)
	}

	modes, data := readArchive(t, filepath.Join(out, InitrdFile))
	for _, want := range []struct {
		path string
		mode uint64
	}{
		{"init", cpio.S_IFREG | 0o755},
		{"dev/console", cpio.S_IFCHR | 0o600},
		{"proc", cpio.S_IFDIR | 0o755},
		{"lib/modules/virtio_net.ko", cpio.S_IFREG | 0o644},
		{"etc/modules", cpio.S_IFREG | 0o644},
		{"etc/ssl/certs/ca-certificates.crt", cpio.S_IFREG | 0o644},
		{"etc/shardfs/enroll-ca.crt", cpio.S_IFREG | 0o644},
	} {
		if modes[want.path] != want.mode {
			t.Errorf("initrd %s: mode %o; want %o", want.path, modes[want.path], want.mode)
		}
	}
	if data["etc/modules"] != "virtio\nvirtio_net\n" || data["init"] != "ELF-ish" {
		t.Errorf("initrd: etc/modules %q, init %q", data["etc/modules"], data["init"])
	}
	for name, content := range data {
		if strings.Contains(content, "SECRET") {
			t.Errorf("initrd %s holds a secret", name)
		}
	}

	if data["etc/shardfs/enroll-ca.crt"] != "ENROLL-CA" {
		t.Errorf("initrd: the enrollment CA %q; want ENROLL-CA", data["etc/shardfs/enroll-ca.crt"])
	}
	// Nothing else is written: the secrets come by enrollment.
	if ents, _ := os.ReadDir(out); len(ents) != 2 {
		t.Errorf("netboot wrote %v; want boot.ipxe and the initrd only", ents)
	}

	script, _ := os.ReadFile(filepath.Join(out, BootScript))
	for _, want := range []string{"#!ipxe\n", "kernel vmlinuz console=tty0 console=ttyS0,115200 quiet edd=off panic=10 shardfs.flavor=discord shardfs.total=1\n", "initrd initrd.cpio.gz\nboot\n"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("boot.ipxe =\n%s\nwant %q", script, want)
		}
	}
	plan := nb.String()
	if !strings.Contains(plan, "at boot /init mounts:\n"+RootFS.String()) {
		t.Errorf("dry run =\n%s\nwant the mount table", plan)
	}
	if want := "file    0644 /etc/shardfs/enroll-ca.crt < " + nb.EnrollCA; !strings.Contains(plan, want) {
		t.Errorf("dry run =\n%s\nwant %q", plan, want)
	}
}

func TestNetbootNoSecrets(t *testing.T) {
	nb := Netboot{Init: "/x", Cmdline: "console=ttyS0 shardfs.total=1"}
	names := []string{}
	for _, o := range nb.Outputs() {
		names = append(names, o.Name)
	}
	if !slices.Equal(names, []string{BootScript, InitrdFile}) {
		t.Errorf("outputs = %v; want boot.ipxe and the initrd only", names)
	}
	// boot.ipxe loads the one initrd and nothing else.
	if script := nb.Script(); strings.Count(script, "\ninitrd ") != 1 || strings.Contains(script, "secrets.cpio") {
		t.Errorf("boot.ipxe =\n%s\nwant the one initrd", script)
	}
	for _, tc := range []struct{ cmdline, want string }{
		{"console=ttyS0 shardfs.total=1", "quiet edd=off panic=10 console=ttyS0 shardfs.total=1"},
		{"console=ttyS0 panic=-1 quiet shardfs.total=1", "edd=off console=ttyS0 panic=-1 quiet shardfs.total=1"},
		{"loglevel=7 edd=on shardfs.total=1", "console=tty0 console=ttyS0,115200 panic=10 loglevel=7 edd=on shardfs.total=1"},
	} {
		nb.Cmdline = tc.cmdline
		if got := nb.KernelCmdline(); got != tc.want {
			t.Errorf("KernelCmdline(%q) = %q; want %q (the given console and options kept, the others added)", tc.cmdline, got, tc.want)
		}
	}
}

func TestCheckStatic(t *testing.T) {
	if err := CheckStatic("/bin/sh"); err == nil {
		t.Skip("/bin/sh is static here")
	} else if !errors.Is(err, ErrNotStatic) || !strings.Contains(err.Error(), "/bin/sh") {
		t.Errorf("CheckStatic(/bin/sh) = %v; want ErrNotStatic naming it", err)
	}
	if err := CheckStatic("/etc/hostname"); err == nil || errors.Is(err, ErrNotStatic) {
		t.Errorf("CheckStatic(a text file) = %v; want an ELF error", err)
	}
	if _, err := os.Stat("/bin/busybox"); err == nil {
		if err := CheckStatic("/bin/busybox"); err != nil {
			t.Errorf("CheckStatic(busybox-static) = %v", err)
		}
	}
}

// kernelDir is the unpacked Debian kernel .ci/run provides.
func kernelDir(t *testing.T) Kernel {
	dir := os.Getenv("SHARDFS_KERNEL_DIR")
	if dir == "" {
		dir = "/var/cache/shardfs/kernel"
	}
	k, err := FindKernel(dir)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %v", err)
		}
		t.Skip(err)
	}
	return k
}

func TestResolveModules(t *testing.T) {
	k := kernelDir(t)
	mods, err := k.ResolveModules([]string{"virtio_pci", "virtio-net", "virtio_net"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		if _, dup := pos[m.Name]; dup {
			t.Errorf("module %s listed twice", m.Name)
		}
		pos[m.Name] = i
		for _, d := range m.Deps {
			if j, ok := pos[d]; !ok || j > i {
				t.Errorf("module %s comes before its dependency %s: %v", m.Name, d, mods)
			}
		}
	}
	for _, want := range []string{"virtio_pci", "virtio_net", "net_failover", "failover"} {
		if _, ok := pos[want]; !ok {
			t.Errorf("ResolveModules(virtio_pci, virtio_net) = %v; want %s among them", mods, want)
		}
	}
	if _, err := k.ResolveModules([]string{"no_such_nic"}); err == nil || !strings.Contains(err.Error(), "no_such_nic") {
		t.Errorf("ResolveModules(no_such_nic) = %v; want an error naming it", err)
	}
}
