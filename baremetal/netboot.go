package baremetal

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardfs/shardfs/initramfs"
)

// Netboot is what `shardfs netboot` writes into its output folder.
type Netboot struct {
	// Init is the host path of the static binary that becomes /init.
	Init string
	// Kernel, when set, supplies the NIC modules and is copied as vmlinuz.
	Kernel *Kernel
	// Modules are the modules to carry, in load order (see
	// Kernel.ResolveModules).
	Modules []KernelModule
	// Cmdline is the kernel command line boot.ipxe passes.
	Cmdline string
	// EnrollCA, when set, is the enrollment CA's certificate (PEM), put
	// at EnrollCAPath: the only thing the node needs to enroll besides
	// the server's address (shardfs.enroll), and no secret.
	EnrollCA string
	// CABundle, when set, is the PEM file of the certificate authorities
	// the node trusts for wss:// and https:// (the gateway, the API), put
	// where Go looks on Linux, CABundlePath.
	CABundle string
}

// CABundlePath is where the image holds the trusted authorities, and
// where Debian's ca-certificates keeps them on the host.
const CABundlePath = "/etc/ssl/certs/ca-certificates.crt"

// The files of the output folder.
const (
	BootScript = "boot.ipxe"
	InitrdFile = "initrd.cpio.gz"
	KernelFile = "vmlinuz"
)

// DefaultConsole is put before the command line unless it names a
// console: the screen, and the serial port last, which makes it the
// console init writes to.
const DefaultConsole = "console=tty0 console=ttyS0,115200"

// DefaultOptions are put before the command line, each unless the line
// sets the same key: quiet, because the kernel's few hundred boot lines
// cost seconds on a 115200-baud serial line (and under TCG, where each
// character is a trap); edd=off, because a diskless node needs no BIOS
// disk probe before the kernel starts; a reboot 10 s after a panic.
var DefaultOptions = []string{"quiet", "edd=off", "panic=10"}

// ErrNotStatic says that /init would need a dynamic loader the image does
// not have.
var ErrNotStatic = errors.New("is dynamically linked: /init must be a static binary; build shardfs with CGO_ENABLED=0 go build ./cmd/shardfs")

// CheckStatic fails when the ELF file at path asks for a dynamic loader.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s %w", path, ErrNotStatic)
		}
	}
	return nil
}

// KernelCmdline is the full command line boot.ipxe passes: DefaultConsole
// and DefaultOptions where the given line does not set them, then the
// given line.
func (n Netboot) KernelCmdline() string {
	words := strings.Fields(n.Cmdline)
	has := func(key string) bool {
		for _, w := range words {
			if k, _, _ := strings.Cut(w, "="); k == key || key == "quiet" && (k == "debug" || k == "loglevel") {
				return true
			}
		}
		return false
	}
	var pre []string
	if !has("console") {
		pre = append(pre, DefaultConsole)
	}
	for _, o := range DefaultOptions {
		if k, _, _ := strings.Cut(o, "="); !has(k) {
			pre = append(pre, o)
		}
	}
	return strings.TrimSpace(strings.Join(append(pre, n.Cmdline), " "))
}

// Initrd is the boot image: /init, the device nodes and folders init
// needs before it mounts anything, and the modules with their load order.
// It holds no secret.
func (n Netboot) Initrd() *initramfs.Image {
	a := &initramfs.Image{Level: gzip.BestCompression}
	a.Copy("init", n.Init, 0o755)
	a.CharDev("dev/console", 0o600, 5, 1)
	a.CharDev("dev/null", 0o666, 1, 3)
	for _, d := range []string{"proc", "sys", "run", "tmp", "etc"} {
		a.Dir(d, 0o755)
	}
	if n.EnrollCA != "" {
		a.Copy(strings.TrimPrefix(EnrollCAPath, "/"), n.EnrollCA, 0o644)
	}
	if n.CABundle != "" {
		a.Copy(strings.TrimPrefix(CABundlePath, "/"), n.CABundle, 0o644)
	}
	if len(n.Modules) > 0 {
		var list strings.Builder
		for _, m := range n.Modules {
			a.Copy(strings.TrimPrefix(ModuleDir, "/")+"/"+m.Name+".ko", m.Path, 0o644)
			list.WriteString(m.Name + "\n")
		}
		a.Text(strings.TrimPrefix(ModuleList, "/"), []byte(list.String()), 0o644)
	}
	return a
}

// Script is boot.ipxe: the kernel and the one initrd, which hold no
// secret; the node enrolls for its secrets (package enroll).
func (n Netboot) Script() string {
	var b strings.Builder
	b.WriteString("#!ipxe\n# Written by shardfs netboot. Nothing here is secret: the node enrolls for its secrets.\n")
	fmt.Fprintf(&b, "kernel %s %s\n", KernelFile, n.KernelCmdline())
	fmt.Fprintf(&b, "initrd %s\n", InitrdFile)
	b.WriteString("boot\n")
	return b.String()
}

func (n Netboot) enrollWhat() string {
	if n.EnrollCA == "" {
		return ""
	}
	return ", the enrollment CA < " + n.EnrollCA
}

// Output is one file of the output folder.
type Output struct {
	Name string
	Mode os.FileMode
	What string
	// write produces the content.
	write func(w io.Writer) error
}

// Outputs are the files Write writes, in order.
func (n Netboot) Outputs() []Output {
	script := n.Script()
	out := []Output{
		{Name: BootScript, Mode: 0o644, What: "iPXE script: kernel " + KernelFile + " " + n.KernelCmdline(), write: func(w io.Writer) error {
			_, err := io.WriteString(w, script)
			return err
		}},
		{Name: InitrdFile, Mode: 0o644, What: fmt.Sprintf("/init < %s, %d modules%s", n.Init, len(n.Modules), n.enrollWhat()), write: func(w io.Writer) error {
			_, err := n.Initrd().WriteTo(w)
			return err
		}},
	}
	if n.Kernel != nil {
		out = append(out, Output{Name: KernelFile, Mode: 0o644, What: n.Kernel.Vmlinuz, write: func(w io.Writer) error {
			f, err := os.Open(n.Kernel.Vmlinuz)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}})
	}
	return out
}

// String is the dry run: the files and what the boot image holds.
func (n Netboot) String() string {
	var b strings.Builder
	for _, o := range n.Outputs() {
		fmt.Fprintf(&b, "%-16s %04o  %s\n", o.Name, o.Mode, o.What)
	}
	fmt.Fprintf(&b, "\n%s holds:\n%s", InitrdFile, n.Initrd())
	fmt.Fprintf(&b, "\nat boot /init mounts:\n%s", RootFS)
	return b.String()
}

// Write writes every output into dir (created 0755), each through a
// temporary file renamed into place, and returns their sizes by name.
func (n Netboot) Write(dir string) (map[string]int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sizes := map[string]int64{}
	for _, o := range n.Outputs() {
		var buf bytes.Buffer
		if err := o.write(&buf); err != nil {
			return sizes, fmt.Errorf("%s: %w", o.Name, err)
		}
		if err := writeFile(filepath.Join(dir, o.Name), buf.Bytes(), o.Mode); err != nil {
			return sizes, err
		}
		sizes[o.Name] = int64(buf.Len())
	}
	return sizes, nil
}

func writeFile(name string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
