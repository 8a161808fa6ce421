package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config describes one boot of a guest.
type Config struct {
	QEMU   string // qemu-system-x86_64
	Kernel string // a vmlinux (booted through PVH) or a vmlinuz
	Initrd string // a gzipped cpio, see Image
	// Append is added to the kernel command line, after
	// "console=ttyS0 panic=-1 quiet no_timer_check".
	Append string
	// MemoryMiB is the guest's memory; zero means 256.
	MemoryMiB int
	// NIC is QEMU's arguments for the guest's network device (a -netdev
	// user,...,restrict=on and its -device); empty means no NIC.
	NIC []string
	// PXE, when set, boots the guest from the network through the NIC's
	// iPXE ROM instead of Kernel and Initrd (NIC is then unused).
	PXE *PXE
	// Ports names the guest's virtio-serial ports, in order: the guest sees
	// them as /dev/vport*p* with /sys/class/virtio-ports/*/name set to the
	// name. Each is a socketpair whose other end is Machine.Ports[name].
	Ports []string
}

// PXE is a network boot from QEMU's user-mode network, restricted to the
// forwards below: its DHCP server hands out BootFile, which the NIC's iPXE
// ROM (Debian package ipxe-qemu) fetches from TFTP, as the files it names.
type PXE struct {
	TFTP     string // the folder QEMU's TFTP server serves
	BootFile string // e.g. boot.ipxe
	// HostFwd are QEMU hostfwd rules, e.g. "tcp:127.0.0.1:HOSTPORT-:GUESTPORT".
	HostFwd []string
	// GuestFwd are QEMU guestfwd rules, e.g.
	// "tcp:10.0.2.100:443-cmd:busybox nc 127.0.0.1 PORT" (each guest
	// connection runs the command).
	GuestFwd []string
}

// IPXEROM is the ROM QEMU loads for a virtio-net-pci NIC; Debian's
// ipxe-qemu provides it.
const IPXEROM = "/usr/lib/ipxe/qemu/efi-virtio.rom"

// Args returns QEMU's arguments for cfg when the port socketpairs are file
// descriptors 3, 4, ... of QEMU.
func (cfg Config) Args() []string {
	mem := cfg.MemoryMiB
	if mem == 0 {
		mem = 256
	}
	args := []string{
		"-accel", "tcg", "-machine", "q35", "-m", strconv.Itoa(mem), "-smp", "1",
		// No display, the serial console on stdio, and exit instead of
		// rebooting, so that a panic (panic=-1) ends the run.
		"-nographic", "-no-reboot",
	}
	if p := cfg.PXE; p != nil {
		netdev := "user,id=n0,restrict=on,tftp=" + p.TFTP + ",bootfile=" + p.BootFile
		for _, f := range p.HostFwd {
			netdev += ",hostfwd=" + f
		}
		for _, f := range p.GuestFwd {
			netdev += ",guestfwd=" + f
		}
		// -cpu max has RDRAND, which Debian's kernel trusts: its random
		// number generator is ready at boot, as on a server, instead of
		// blocking getrandom for many seconds under TCG.
		args = append(args, "-cpu", "max", "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0", "-boot", "n")
	} else {
		args = append(args, "-kernel", cfg.Kernel, "-initrd", cfg.Initrd,
			// no_timer_check: under TCG on a loaded host the kernel's
			// check of the timer interrupt failed ("IO-APIC + timer
			// doesn't work!", a panic at 0.04 s) in the flake hunt.
			"-append", strings.TrimSpace("console=ttyS0 panic=-1 quiet no_timer_check "+cfg.Append))
		if len(cfg.NIC) == 0 {
			// No NIC: QEMU adds a user-mode one otherwise.
			args = append(args, "-nic", "none")
		} else {
			args = append(args, cfg.NIC...)
		}
	}
	if len(cfg.Ports) > 0 {
		args = append(args, "-device", "virtio-serial-pci,id=vser")
	}
	for i, name := range cfg.Ports {
		id := "port" + strconv.Itoa(i)
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", id, 3+i),
			"-device", fmt.Sprintf("virtserialport,bus=vser.0,chardev=%s,name=%s", id, name))
	}
	return args
}

// Machine is a running guest.
type Machine struct {
	// Console is the transcript of the guest's serial console (and QEMU's
	// own messages).
	Console *Console
	// Ports are the test process's ends of the virtio-serial ports, by
	// name.
	Ports map[string]net.Conn
	// Started is when QEMU was started.
	Started time.Time

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	err   error
}

// Boot starts QEMU. The guest runs until it powers off, ctx ends (QEMU is
// killed), or Kill. The caller must call Wait.
func Boot(ctx context.Context, cfg Config) (*Machine, error) {
	m := &Machine{Console: NewConsole(), Ports: map[string]net.Conn{}, done: make(chan struct{})}
	cmd := exec.CommandContext(ctx, cfg.QEMU, cfg.Args()...)
	cmd.Stdout, cmd.Stderr = m.Console, m.Console
	cmd.WaitDelay = 5 * time.Second
	var theirs []*os.File
	closeAll := func() {
		for _, f := range theirs {
			f.Close()
		}
	}
	for _, name := range cfg.Ports {
		host, guest, err := socketpair(name)
		if err != nil {
			closeAll()
			m.closePorts()
			return nil, err
		}
		m.Ports[name] = host
		theirs = append(theirs, guest)
	}
	cmd.ExtraFiles = theirs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		closeAll()
		m.closePorts()
		return nil, err
	}
	m.stdin = stdin
	m.Started = time.Now()
	err = cmd.Start()
	// QEMU holds its ends now; ours must go, or the test would never see
	// EOF on a port after QEMU exits.
	closeAll()
	if err != nil {
		m.closePorts()
		return nil, fmt.Errorf("integration: starting QEMU: %w", err)
	}
	m.cmd = cmd
	go func() {
		m.err = cmd.Wait()
		m.Console.Close()
		close(m.done)
	}()
	return m, nil
}

// socketpair returns a connected pair: a net.Conn for the test and a file
// for QEMU.
func socketpair(name string) (net.Conn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("integration: socketpair for port %s: %w", name, err)
	}
	hf := os.NewFile(uintptr(fds[0]), "port-"+name)
	defer hf.Close()
	host, err := net.FileConn(hf)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, err
	}
	return host, os.NewFile(uintptr(fds[1]), "port-"+name), nil
}

func (m *Machine) closePorts() {
	for _, c := range m.Ports {
		c.Close()
	}
}

// Type writes s to the guest's serial console, as if typed there.
func (m *Machine) Type(s string) error {
	_, err := io.WriteString(m.stdin, s)
	return err
}

// Done is closed when QEMU has exited.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait waits for QEMU to exit, closes the ports and returns QEMU's exit
// error (nil when the guest powered off).
func (m *Machine) Wait() error {
	<-m.done
	m.closePorts()
	return m.err
}

// Kill ends QEMU at once.
func (m *Machine) Kill() {
	if m.cmd != nil && m.cmd.Process != nil {
		m.cmd.Process.Kill()
	}
}

// ErrExited is returned by waits on a guest whose QEMU has exited.
var ErrExited = errors.New("integration: QEMU exited")

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
