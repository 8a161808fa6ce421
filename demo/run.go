package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

// RunConfig configures Run: the demo, and where its tree is served.
type RunConfig struct {
	Config
	// Listen are the 9P listeners' addresses (see fsrv.ParseListenAddr),
	// TLS the files its tls! ones serve with.
	Listen []string
	TLS    fsrv.TLSFiles
	// HowTo receives how to look at the tree, once it is served.
	HowTo io.Writer
}

// Run opens the listeners, starts the demo and serves its tree until ctx
// ends, then closes the node.
func Run(ctx context.Context, rc RunConfig) error {
	ls, err := fsrv.Open(rc.Listen, rc.TLS)
	if err != nil {
		return err
	}
	d, err := Start(ctx, rc.Config)
	if err != nil {
		ls.Close()
		return err
	}
	printHowTo(rc.HowTo, rc.Flavor, len(d.Scheduler.Plan().Local), rc.Chaos, ls.List)
	return d.ServeAndClose(ctx, ls.List...)
}

// printHowTo says where the tree is served and how to look at it.
func printHowTo(w io.Writer, flavor core.Flavor, shards int, chaos time.Duration, ls []net.Listener) {
	// The how-to writes to ctl: it names read-write listeners only.
	var tcp, unixAddr string
	for _, l := range ls {
		if fsrv.IsReadOnly(l) {
			continue
		}
		switch a := fsrv.AddrString(l); {
		case strings.HasPrefix(a, "tcp!") && tcp == "":
			tcp = a
		case strings.HasPrefix(a, "unix!") && unixAddr == "":
			unixAddr = a
		}
	}
	fmt.Fprintf(w, "shardfs demo: %d %s shards against the built-in gateway simulator", shards, flavor)
	if chaos > 0 {
		fmt.Fprintf(w, ", a random fault every %v", chaos)
	}
	fmt.Fprintln(w)
	for _, l := range ls {
		if fsrv.IsReadOnly(l) {
			fmt.Fprintf(w, "serving 9P on %s (read-only)\n", fsrv.AddrString(l))
		} else {
			fmt.Fprintf(w, "serving 9P on %s\n", fsrv.AddrString(l))
		}
	}
	if tcp == "" && unixAddr == "" {
		fmt.Fprintln(w, "every listener is read-only: cat and tail work, writes to ctl are refused")
		return
	}
	addr := tcp
	if addr == "" {
		addr = unixAddr
	}
	fmt.Fprintln(w, "\nmount it with Linux v9fs:")
	if tcp != "" {
		parts := strings.Split(tcp, "!")
		fmt.Fprintf(w, "  sudo mkdir -p /mnt/shardfs && sudo mount -t 9p -o trans=tcp,port=%s,version=9p2000.L %s /mnt/shardfs\n", parts[2], parts[1])
	}
	if unixAddr != "" {
		fmt.Fprintf(w, "  sudo mount -t 9p -o trans=unix,version=9p2000.L %s /mnt/shardfs\n", strings.TrimPrefix(unixAddr, "unix!"))
	}
	fmt.Fprintln(w, "  cat /mnt/shardfs/status; echo reset > /mnt/shardfs/0/ctl; tail -f /mnt/shardfs/events")
	if tcp != "" {
		fmt.Fprintf(w, "or with plan9port: 9pfuse '%s' /mnt/shardfs\n", tcp)
	}
	fmt.Fprintln(w, "or with the built-in client:")
	fmt.Fprintf(w, "  shardfs cat --addr '%s' status\n", addr)
	fmt.Fprintf(w, "  shardfs write --addr '%s' 0/ctl reset\n", addr)
	fmt.Fprintf(w, "  shardfs tail --addr '%s' events\n", addr)
	fmt.Fprintln(w, "Ctrl-C stops.")
}
