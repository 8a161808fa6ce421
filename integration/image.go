package integration

import (
	"fmt"
	"strings"

	"github.com/shardfs/shardfs/initramfs"
)

// AddBusybox adds a static busybox as /bin/busybox with a symbolic link for
// each of its applets, where busybox --list-full says it belongs.
func AddBusybox(im *initramfs.Image, busybox string) error {
	out, err := execOutput(busybox, "--list-full")
	if err != nil {
		return fmt.Errorf("integration: listing busybox applets: %w", err)
	}
	im.Copy("bin/busybox", busybox, 0o755)
	for _, applet := range strings.Fields(out) {
		applet = initramfs.Clean(applet)
		if applet == "bin/busybox" || im.Has(applet) {
			continue
		}
		// A relative target works wherever the link lives.
		rel := strings.Repeat("../", strings.Count(applet, "/")) + "bin/busybox"
		im.Symlink(applet, rel)
	}
	return nil
}

// AddModules adds kernel modules from the kit as /lib/modules/NAME.ko and
// lists them, in load order, in /etc/modules for the guest to insmod.
func AddModules(im *initramfs.Image, k *Kit, names ...string) error {
	var list strings.Builder
	for _, n := range names {
		p, err := k.Module(n)
		if err != nil {
			return err
		}
		im.Copy("lib/modules/"+n+".ko", p, 0o644)
		list.WriteString(n + "\n")
	}
	im.Text("etc/modules", []byte(list.String()), 0o644)
	return nil
}
