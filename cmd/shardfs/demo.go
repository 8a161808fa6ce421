package main

import (
	"context"
	"flag"
	"io"
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
	fl.Var(&listens, "listen", "9P listener: tcp!host!port, host:port, unix!path, a path or tls!host!port, with ,ro or ,insecure after it (repeatable; default: "+fsrv.DefaultAddr+" and unix!"+fsrv.DefaultSocket()+", both read-write)")
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
	if len(listens) == 0 {
		listens = demoListeners()
	}
	log, _, stopLog := newLogger(stderr, *debug)
	defer stopLog()
	return demo.Run(ctx, demo.RunConfig{
		Config: demo.Config{Flavor: flavor, Shards: *shards, Traffic: *traffic, Chaos: *chaos, Compression: comp, Backoff: core.Fixed(2 * time.Second), Logger: log},
		Listen: listens, TLS: tf.files(), HowTo: stdout,
	})
}
