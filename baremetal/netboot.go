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
	// EtcdCA, EtcdCert and EtcdKey, when set, are etcd's TLS files (the
	// CA, and the client certificate and key), put into secrets.cpio.gz.
	EtcdCA, EtcdCert, EtcdKey string
	// TLSCert, TLSKey and TLSClientCA, when set, are the TLS listener's
	// files, put into tls.cpio.gz.
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
	TLSFile     = "tls.cpio.gz"
	KernelFile  = "vmlinuz"
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

// Secrets is the secrets initrd: the token and etcd's TLS files, the
// token and etcd's key readable by root only. The files are read only when
// written. Without it the node still serves its tree (over the listener
// tls.cpio.gz brought), every shard FATAL with "no token".
func (n Netboot) Secrets() *initramfs.Image {
	a := secretsDir()
	if n.TokenFile != "" {
		a.Copy(TokenPath, n.TokenFile, 0o600)
	}
	if n.EtcdCA != "" {
		a.Copy(EtcdCAPath, n.EtcdCA, 0o644)
	}
	if n.EtcdKey != "" {
		a.Copy(EtcdCertPath, n.EtcdCert, 0o644)
		a.Copy(EtcdKeyPath, n.EtcdKey, 0o600)
	}
	return a
}

// TLS is the TLS listener's initrd: its certificate, key (readable by
// root only) and the CA of the clients it accepts. It is apart from the
// token so that a node whose secrets.cpio.gz is missing still exports its
// tree, and says why it does nothing.
func (n Netboot) TLS() *initramfs.Image {
	a := secretsDir()
	a.Copy(TLSCertPath, n.TLSCert, 0o644)
	a.Copy(TLSKeyPath, n.TLSKey, 0o600)
	a.Copy(TLSClientCAPath, n.TLSClientCA, 0o644)
	return a
}

// secretsDir is an archive with /secrets (mode 0700) only.
func secretsDir() *initramfs.Image {
	a := &initramfs.Image{Level: gzip.BestCompression}
	a.Dir(filepath.Dir(strings.TrimPrefix(TokenPath, "/")), 0o700)
	return a
}

func (n Netboot) hasSecrets() bool { return n.TokenFile != "" || n.EtcdCA != "" || n.EtcdKey != "" }
func (n Netboot) hasTLS() bool     { return n.TLSKey != "" }

// Script is boot.ipxe. A missing secrets.cpio.gz or tls.cpio.gz does not
// stop the boot: the node comes up and says on its console what it lacks
// (without the token it serves its tree, every shard FATAL with "no
// token"; without the TLS files it has no TLS listener).
func (n Netboot) Script() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!ipxe\n# Written by shardfs netboot. It holds no secret: the token is in %s.\n", SecretsFile)
	fmt.Fprintf(&b, "kernel %s %s\n", KernelFile, n.KernelCmdline())
	fmt.Fprintf(&b, "initrd %s\n", InitrdFile)
	if n.hasTLS() {
		fmt.Fprintf(&b, "initrd %s || echo shardfs: no %s: the node has no TLS listener\n", TLSFile, TLSFile)
	}
	fmt.Fprintf(&b, "initrd %s || echo shardfs: no %s: the node boots without its token\n", SecretsFile, SecretsFile)
	b.WriteString("boot\n")
	return b.String()
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
	if n.hasTLS() {
		out = append(out, Output{Name: TLSFile, Mode: 0o600, What: "the TLS listener's certificate, key and client CA", write: func(w io.Writer) error {
			_, err := n.TLS().WriteTo(w)
			return err
		}})
	}
	if n.hasSecrets() {
		var what []string
		if n.TokenFile != "" {
			what = append(what, "the token")
		}
		if n.EtcdCA != "" || n.EtcdKey != "" {
			what = append(what, "etcd's TLS files")
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
	if n.hasTLS() {
		fmt.Fprintf(&b, "\n%s holds:\n%s", TLSFile, n.TLS())
	}
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
