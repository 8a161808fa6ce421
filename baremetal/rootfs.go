package baremetal

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A Mount is one file system PID 1 mounts, in the style of u-root's
// libinit: a value that prints itself, so that a dry run shows the plan.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
	Mode                   os.FileMode // of Target when it must be created
}

func (m Mount) String() string {
	opts := mountFlagNames(m.Flags)
	if m.Data != "" {
		opts = append(opts, m.Data)
	}
	if len(opts) == 0 {
		opts = []string{"defaults"}
	}
	return fmt.Sprintf("mount %-8s %-10s %-8s %s", m.FSType, m.Target, m.Source, strings.Join(opts, ","))
}

func mountFlagNames(f uintptr) []string {
	var out []string
	for _, n := range []struct {
		bit  uintptr
		name string
	}{{unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_NOEXEC, "noexec"}, {unix.MS_RELATIME, "relatime"}} {
		if f&n.bit != 0 {
			out = append(out, n.name)
		}
	}
	return out
}

// RootFS is the setup of the root file system: the pseudo file systems of
// a diskless node. The initramfs itself is the root and stays writable.
var RootFS = Table{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Mode: 0o555},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Mode: 0o555},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755", Mode: 0o755},
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "mode=0620,ptmxmode=0666", Mode: 0o755},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755", Mode: 0o755},
	{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777", Mode: 0o1777},
}

// Table is a list of mounts, applied in order.
type Table []Mount

func (t Table) String() string {
	var b strings.Builder
	for _, m := range t {
		b.WriteString(m.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Apply creates each target under root and mounts it. A target that is
// already a mount of the same type (a kernel that automounts devtmpfs)
// is left alone. It goes on after a failure and returns every error.
func (t Table) Apply(root string) error {
	var errs []error
	for _, m := range t {
		target := root + m.Target
		if err := os.MkdirAll(target, m.Mode.Perm()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
			continue
		}
		err := unix.Mount(m.Source, target, m.FSType, m.Flags, m.Data)
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}
