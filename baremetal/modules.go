package baremetal

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Where the image keeps its kernel modules: ModuleList names them in load
// order, one a line; each is ModuleDir/NAME.ko.
const (
	ModuleDir  = "/lib/modules"
	ModuleList = "/etc/modules"
)

// DefaultNICModules are the NIC drivers netboot puts in an image unless
// told otherwise: QEMU's virtio (virtio_pci is its bus driver, which no
// NIC module depends on) and the common server NICs. Their dependencies
// come along.
var DefaultNICModules = []string{"virtio_pci", "virtio_net", "e1000", "e1000e", "igb", "ixgbe", "tg3", "r8169"}

// KernelModule is a module file of a kernel package.
type KernelModule struct {
	Name string // as the kernel names it, with '_'
	Path string // the .ko file on the host
	Deps []string
}

// ErrCompressedModule says that a kernel ships its modules compressed,
// which this image's loader does not read.
var ErrCompressedModule = errors.New("compressed module (.ko.xz, .ko.zst, .ko.gz): unpack it, or use a kernel whose modules are plain .ko")

// Kernel is Debian's kernel package unpacked with dpkg -x: the newest
// boot/vmlinuz-RELEASE that has its lib/modules/RELEASE.
type Kernel struct {
	Release string
	Vmlinuz string
	Modules string // lib/modules/RELEASE
}

// FindKernel locates the kernel in dir.
func FindKernel(dir string) (Kernel, error) {
	kernels, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	slices.Sort(kernels)
	for _, kern := range slices.Backward(kernels) {
		release := strings.TrimPrefix(filepath.Base(kern), "vmlinuz-")
		for _, mods := range []string{"lib/modules", "usr/lib/modules"} {
			m := filepath.Join(dir, mods, release)
			if fi, err := os.Stat(filepath.Join(m, "kernel")); err == nil && fi.IsDir() {
				return Kernel{Release: release, Vmlinuz: kern, Modules: m}, nil
			}
		}
	}
	return Kernel{}, fmt.Errorf("--kernel %s: no boot/vmlinuz-RELEASE with its lib/modules/RELEASE/kernel (Debian's linux-image package unpacked with dpkg -x)", dir)
}

// ResolveModules returns the modules names need with their dependencies
// (read from each module's .modinfo), dependencies first, each once.
func (k Kernel) ResolveModules(names []string) ([]KernelModule, error) {
	files := map[string]string{}
	compressed := map[string]string{}
	err := filepath.WalkDir(filepath.Join(k.Modules, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := d.Name()
		if n, ok := strings.CutSuffix(base, ".ko"); ok {
			files[modName(n)] = p
			return nil
		}
		for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz"} {
			if n, ok := strings.CutSuffix(base, ext); ok {
				compressed[modName(n)] = p
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the modules of %s: %w", k.Release, err)
	}
	var out []KernelModule
	done := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		name = modName(name)
		if done[name] {
			return nil
		}
		if slices.Contains(chain, name) {
			return fmt.Errorf("module %s: dependency cycle %s", name, strings.Join(append(chain, name), " -> "))
		}
		p, ok := files[name]
		if !ok {
			if c, ok := compressed[name]; ok {
				return fmt.Errorf("module %s (%s): %w", name, c, ErrCompressedModule)
			}
			return fmt.Errorf("module %s: not found under %s (is it built into this kernel, or misspelt?)", name, k.Modules)
		}
		deps, err := moduleDeps(p)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		done[name] = true
		out = append(out, KernelModule{Name: name, Path: p, Deps: deps})
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// modName is the kernel's spelling of a module name.
func modName(n string) string { return strings.ReplaceAll(n, "-", "_") }

// moduleDeps reads depends= from a module's .modinfo section.
func moduleDeps(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, modName(d))
			}
		}
	}
	return deps, nil
}

// LoadModules loads the modules listed in root+ModuleList from
// root+ModuleDir, in order, and reports each through report. A module
// that is already loaded is not an error; one that fails is reported and
// the rest still load (a driver for absent hardware may refuse, and the
// NIC that is present may be among the later ones).
func LoadModules(root string, report func(name string, err error)) error {
	f, err := os.Open(root + ModuleList)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no modules: the NIC drivers are built in
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		report(name, loadModule(filepath.Join(root+ModuleDir, name+".ko")))
	}
	return sc.Err()
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}
