package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConsoleExpect(t *testing.T) {
	c := NewConsole()
	// Firmware escapes before a marker, and a marker that is only the
	// start of a longer line, must not confuse Expect.
	c.Write([]byte("\x1b[2J@@ boot\r\n@@ next-one\r\n@@ ne"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if text, err := c.Expect(ctx, "@@ boot"); err != nil || text != "\x1b[2J@@ boot" {
		t.Errorf("Expect(boot) = %q, %v", text, err)
	}
	done := make(chan string)
	go func() {
		text, err := c.Expect(ctx, "@@ next")
		if err != nil {
			text = err.Error()
		}
		done <- text
	}()
	c.Write([]byte("xt\r\nrest"))
	if got := <-done; got != "\r\n@@ next-one\r\n@@ next" {
		t.Errorf("Expect(next) = %q", got)
	}
	c.Close()
	if _, err := c.Expect(ctx, "@@ never"); !errors.Is(err, ErrExited) {
		t.Errorf("Expect after Close = %v; want ErrExited", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelShort()
	open := NewConsole()
	if _, err := open.Expect(short, "@@ never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Expect past the deadline = %v; want DeadlineExceeded", err)
	}
}

func TestConfigArgs(t *testing.T) {
	args := strings.Join(Config{QEMU: "qemu", Kernel: "vmlinux", Initrd: "initrd", Ports: []string{"ctl", "p9"}}.Args(), " ")
	for _, want := range []string{
		"-accel tcg", "-machine q35", "-m 256", "-nic none", "-no-reboot", "-kernel vmlinux", "-initrd initrd",
		"-chardev socket,id=port0,fd=3 -device virtserialport,bus=vser.0,chardev=port0,name=ctl",
		"-chardev socket,id=port1,fd=4 -device virtserialport,bus=vser.0,chardev=port1,name=p9",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("Args() = %s; want it to contain %s", args, want)
		}
	}
}

func TestConfigArgsPXE(t *testing.T) {
	args := strings.Join(Config{QEMU: "qemu", Kernel: "unused", PXE: &PXE{
		TFTP: "/srv/tftp", BootFile: "boot.ipxe",
		HostFwd:  []string{"tcp:127.0.0.1:9-:5641"},
		GuestFwd: []string{"tcp:10.0.2.100:443-cmd:nc 127.0.0.1 8"},
	}}.Args(), " ")
	want := "-netdev user,id=n0,restrict=on,tftp=/srv/tftp,bootfile=boot.ipxe,hostfwd=tcp:127.0.0.1:9-:5641,guestfwd=tcp:10.0.2.100:443-cmd:nc 127.0.0.1 8 -device virtio-net-pci,netdev=n0 -boot n"
	if !strings.Contains(args, want) {
		t.Errorf("Args() = %s; want it to contain %s", args, want)
	}
	for _, not := range []string{"-kernel", "-nic none"} {
		if strings.Contains(args, not) {
			t.Errorf("Args() = %s; a network boot has no %s", args, not)
		}
	}
}
