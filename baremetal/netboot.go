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
	// TokenFile, when set, is read into secrets.cpio.gz.
	TokenFile string
	// TLSCert, TLSKey and TLSClientCA, when set, are the TLS listener's
	// files, put into secrets.cpio.gz.
	TLSCert, TLSKey, TLSClientCA string
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
	BootScript  = "boot.ipxe"
	InitrdFile  = "initrd.cpio.gz"
	SecretsFile = "secrets.cpio.gz"
	KernelFile  = "vmlinuz"
)

// DefaultConsole is put before the command line unless it names a
// console: the screen, and the serial port last, which makes it the
// console init writes to; quiet, because the kernel's few hundred boot
// lines cost seconds on a 115200-baud serial line (and under TCG); a
// reboot 10 s after a panic.
const DefaultConsole = "console=tty0 console=ttyS0,115200 quiet panic=10"

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

// KernelCmdline is the full command line boot.ipxe passes.
func (n Netboot) KernelCmdline() string {
	if strings.Contains(" "+n.Cmdline, " console=") {
		return strings.TrimSpace(n.Cmdline)
	}
	return strings.TrimSpace(DefaultConsole + " " + n.Cmdline)
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

// Secrets is the second initrd: the token and the TLS listener's files,
// the token and the key readable by root only. The files are read only
// when written.
func (n Netboot) Secrets() *initramfs.Image {
	a := &initramfs.Image{Level: gzip.BestCompression}
	a.Dir(filepath.Dir(strings.TrimPrefix(TokenPath, "/")), 0o700)
	if n.TokenFile != "" {
		a.Copy(TokenPath, n.TokenFile, 0o600)
	}
	if n.TLSKey != "" {
		a.Copy(TLSCertPath, n.TLSCert, 0o644)
		a.Copy(TLSKeyPath, n.TLSKey, 0o600)
		a.Copy(TLSClientCAPath, n.TLSClientCA, 0o644)
	}
	return a
}

func (n Netboot) hasSecrets() bool { return n.TokenFile != "" || n.TLSKey != "" }

// Script is boot.ipxe. A missing secrets.cpio.gz does not stop the boot:
// the node comes up, serves its tree and says that it has no token.
func (n Netboot) Script() string {
	return fmt.Sprintf(`#!ipxe
# Written by shardfs netboot. It holds no secret: the token is in %s.
kernel %s %s
initrd %s
initrd %s || echo shardfs: no %s: the node boots without its token
boot
`, SecretsFile, KernelFile, n.KernelCmdline(), InitrdFile, SecretsFile, SecretsFile)
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
		{Name: InitrdFile, Mode: 0o644, What: fmt.Sprintf("/init < %s, %d modules", n.Init, len(n.Modules)), write: func(w io.Writer) error {
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
	if n.hasSecrets() {
		var what []string
		if n.TokenFile != "" {
			what = append(what, "the token")
		}
		if n.TLSKey != "" {
			what = append(what, "the TLS listener's certificate, key and client CA")
		}
		out = append(out, Output{Name: SecretsFile, Mode: 0o600, What: strings.Join(what, ", "), write: func(w io.Writer) error {
			_, err := n.Secrets().WriteTo(w)
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
	if n.hasSecrets() {
		fmt.Fprintf(&b, "\n%s holds:\n%s", SecretsFile, n.Secrets())
	}
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
