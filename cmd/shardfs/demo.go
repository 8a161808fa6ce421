package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
)

// runDemo runs the built-in gateway simulator and a node against it, with
// traffic flowing, and prints how to look at the tree.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("demo", flag.ContinueOnError)
	fl.SetOutput(stderr)
	flavorName := fl.String("flavor", "discord", "gateway flavor: discord or fluxer")
	shards := fl.Int("shards", 4, "number of shards")
	chaos := fl.Duration("chaos", 0, "inject a random recoverable fault this often (e.g. 5s); 0: never")
	traffic := fl.Float64("traffic", 1, "MESSAGE_CREATE events per second per shard")
	compress := fl.String("compress", "none", "transport compression: none, zlib-stream or zstd-stream")
	debug := fl.Bool("debug", false, "log at debug level")
	var listens listenFlag
	fl.Var(&listens, "listen", "9P listener: tcp!host!port, host:port, unix!path, a path or tls!host!port, with ,ro or ,insecure after it (repeatable; default: "+fsrv.DefaultAddr+" and unix!"+defaultSocket()+", both read-write)")
	var tf tlsFlags
	tf.register(fl)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	flavor, err := core.ParseFlavor(*flavorName)
	if err != nil {
		return flagErr(fl, "--flavor: %v", err)
	}
	if *shards < 1 || *shards > 4096 {
		return flagErr(fl, "--shards %d: want 1 to 4096", *shards)
	}
	if *chaos < 0 || *chaos > 0 && *chaos < demo.MinChaos {
		return flagErr(fl, "--chaos %v: want 0 or at least %v", *chaos, demo.MinChaos)
	}
	comp, err := gateway.ParseCompression(*compress)
	if err != nil {
		return flagErr(fl, "--compress: %v", err)
	}
	ls, err := listen(listens, demoListeners(), &tf)
	if err != nil {
		return err
	}
	log, _, stopLog := newLogger(stderr, *debug)
	defer stopLog()
	d, err := demo.Start(ctx, demo.Config{Flavor: flavor, Shards: *shards, Traffic: *traffic, Chaos: *chaos, Compression: comp, Backoff: core.Fixed(2 * time.Second), Logger: log})
	if err != nil {
		closeListeners(ls)
		return err
	}
	printHowTo(stdout, flavor, *shards, *chaos, ls)
	return runNode(ctx, d.Node, netListeners(ls), log)
}

func printHowTo(w io.Writer, flavor core.Flavor, shards int, chaos time.Duration, ls []listener) {
	// The how-to writes to ctl: it names read-write listeners only.
	var tcp, unixAddr string
	for _, l := range ls {
		if l.ro {
			continue
		}
		switch a := addrString(l.l); {
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
		if l.ro {
			fmt.Fprintf(w, "serving 9P on %s (read-only)\n", addrString(l.l))
		} else {
			fmt.Fprintf(w, "serving 9P on %s\n", addrString(l.l))
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
