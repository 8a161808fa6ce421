package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// KernelDirEnv names the environment variable that points at Debian's
// kernel package unpacked with dpkg -x (the directory holding boot/ and
// lib/modules/).
const KernelDirEnv = "SHARDFS_KERNEL_DIR"

// DefaultKernelDir is where .ci/run unpacks the kernel package when
// KernelDirEnv is not set.
const DefaultKernelDir = "/var/cache/shardfs/kernel"

// DefaultBusybox is where Debian's busybox-static installs its binary.
const DefaultBusybox = "/bin/busybox"

// A Kit is what booting a guest needs from the host.
type Kit struct {
	QEMU    string // qemu-system-x86_64
	Busybox string // a statically linked busybox
	Release string // the kernel release, e.g. 6.1.0-57-amd64
	Kernel  string // boot/vmlinuz-Release
	Modules string // lib/modules/Release

	modules map[string]string // module name → .ko path, from Modules
}

// ErrNoKit says that the host lacks something a boot needs; the error
// wrapping it says what and how to get it.
var ErrNoKit = errors.New("integration: no QEMU kit on this machine")

// FindKit locates the kit: qemu-system-x86_64 on PATH, DefaultBusybox, and
// the kernel package in $SHARDFS_KERNEL_DIR or DefaultKernelDir. Its error
// wraps ErrNoKit and lists everything missing.
func FindKit() (Kit, error) {
	var k Kit
	var missing []string
	var err error
	if k.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		missing = append(missing, "qemu-system-x86_64 (Debian package qemu-system-x86)")
	}
	k.Busybox = DefaultBusybox
	if fi, err := os.Stat(k.Busybox); err != nil || !fi.Mode().IsRegular() {
		missing = append(missing, DefaultBusybox+" (Debian package busybox-static)")
	}
	dir := os.Getenv(KernelDirEnv)
	if dir == "" {
		dir = DefaultKernelDir
	}
	if err := k.findKernel(dir); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		return Kit{}, fmt.Errorf("%w: missing %s; run .ci/run as root (or set %s)", ErrNoKit, strings.Join(missing, ", "), KernelDirEnv)
	}
	return k, nil
}

// findKernel picks the newest vmlinuz under dir/boot that has its modules.
func (k *Kit) findKernel(dir string) error {
	kernels, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	slices.Sort(kernels)
	for _, kern := range slices.Backward(kernels) {
		release := strings.TrimPrefix(filepath.Base(kern), "vmlinuz-")
		for _, mods := range []string{"lib/modules", "usr/lib/modules"} {
			m := filepath.Join(dir, mods, release)
			if fi, err := os.Stat(filepath.Join(m, "kernel")); err == nil && fi.IsDir() {
				k.Release, k.Kernel, k.Modules = release, kern, m
				return nil
			}
		}
	}
	return fmt.Errorf("a Debian kernel package unpacked in %s (boot/vmlinuz-* and lib/modules/*)", dir)
}

// Module returns the path of a kernel module by name (without .ko).
// Compressed modules are not supported: busybox insmod loads plain .ko
// files, which is what Debian's 6.1 kernels ship.
func (k *Kit) Module(name string) (string, error) {
	if k.modules == nil {
		k.modules = map[string]string{}
		err := filepath.WalkDir(filepath.Join(k.Modules, "kernel"), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if n, ok := strings.CutSuffix(d.Name(), ".ko"); ok && !d.IsDir() {
				k.modules[n] = path
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("integration: listing modules: %w", err)
		}
	}
	// Module names use '_' and '-' interchangeably.
	for _, n := range []string{name, strings.ReplaceAll(name, "_", "-"), strings.ReplaceAll(name, "-", "_")} {
		if p, ok := k.modules[n]; ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("integration: module %s not found under %s", name, k.Modules)
}

// xzMagic starts an xz stream; Debian compresses the kernel inside vmlinuz
// with xz.
var xzMagic = []byte("\xfd7zXZ\x00")

// Vmlinux returns the kernel as an uncompressed ELF file, which QEMU boots
// through its PVH entry point: under TCG that skips the seconds the kernel
// spends decompressing itself. It is extracted from the vmlinuz with xz(1)
// once and kept in cacheDir under a name that changes with the vmlinuz.
func (k Kit) Vmlinux(cacheDir string) (string, error) {
	fi, err := os.Stat(k.Kernel)
	if err != nil {
		return "", err
	}
	out := filepath.Join(cacheDir, fmt.Sprintf("vmlinux-%s-%d-%d", k.Release, fi.Size(), fi.ModTime().Unix()))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	xz, err := exec.LookPath("xz")
	if err != nil {
		return "", fmt.Errorf("integration: extracting vmlinux needs xz (Debian package xz-utils): %w", err)
	}
	data, err := os.ReadFile(k.Kernel)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	// The magic can occur before the real stream (in the decompressor's
	// code): try each occurrence until one decompresses to an ELF file.
	for off := bytes.Index(data, xzMagic); off >= 0; {
		tmp, err := os.CreateTemp(cacheDir, ".vmlinux-*")
		if err != nil {
			return "", err
		}
		cmd := exec.Command(xz, "--decompress", "--stdout", "--single-stream")
		cmd.Stdin, cmd.Stdout = bytes.NewReader(data[off:]), tmp
		err = cmd.Run()
		tmp.Close()
		if err == nil && isELF(tmp.Name()) {
			if err := os.Rename(tmp.Name(), out); err != nil {
				os.Remove(tmp.Name())
				return "", err
			}
			return out, nil
		}
		os.Remove(tmp.Name())
		next := bytes.Index(data[off+1:], xzMagic)
		if next < 0 {
			break
		}
		off += 1 + next
	}
	return "", fmt.Errorf("integration: no xz-compressed ELF kernel found in %s", k.Kernel)
}

func isELF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = f.Read(magic[:])
	return err == nil && string(magic[:]) == "\x7fELF"
}
