package main

import (
	"context"
	"flag"
	"io"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/gateway/gatewaysim/simctl"
)

// runSim runs the gateway simulator on its own, for serve, supervise
// and a fleet to connect to (package simctl).
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("sim", flag.ContinueOnError)
	fl.SetOutput(stderr)
	flavorName := fl.String("flavor", "discord", "gateway flavor: discord or fluxer")
	listen := fl.String("listen", simctl.DefaultListen, "HOST:PORT of the HTTP API and the gateway WebSocket")
	tokenFile := fl.String("token-file", simctl.DefaultTokenFile(), "the bot's token; made at random (mode 0600) when the file does not exist, and never printed")
	shards := fl.Int("shards", 1, "shard count discovery recommends")
	guilds := fl.Int("guilds", 0, "guilds the bot is in (default 2 per shard; over 2,500 on a shard closes it 4011)")
	maxConc := fl.Int("max-concurrency", 1, "Discord's identify concurrency (identifies per 5 s)")
	traffic := fl.Float64("traffic", 1, "MESSAGE_CREATE events per second per shard")
	ctl := fl.String("ctl", simctl.DefaultCtl(), "9P address of the control tree (ctl, status, events): unix!path, a path or tcp!127.0.0.1!port")
	debug := fl.Bool("debug", false, "log every connection at debug level")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	var flavor gatewaysim.Flavor
	switch *flavorName {
	case "discord":
	case "fluxer":
		flavor = gatewaysim.Fluxer
	default:
		return flagErr(fl, "--flavor %q: want discord or fluxer", *flavorName)
	}
	switch {
	case *shards < 1 || *shards > simctl.MaxShards:
		return flagErr(fl, "--shards %d: want 1 to %d", *shards, simctl.MaxShards)
	case *guilds < 0 || *guilds > simctl.MaxShards*gatewaysim.MaxGuildsPerShard:
		return flagErr(fl, "--guilds %d: want 0 (2 per shard) to %d", *guilds, simctl.MaxShards*gatewaysim.MaxGuildsPerShard)
	case *maxConc < 1 || *maxConc > 1024:
		return flagErr(fl, "--max-concurrency %d: want 1 to 1024", *maxConc)
	case *traffic < 0 || *traffic > 10000:
		return flagErr(fl, "--traffic %v: want 0 to 10000 per second per shard", *traffic)
	}
	log, _, stopLog := newLogger(stderr, *debug)
	defer stopLog()
	return simctl.Run(ctx, simctl.Config{
		Flavor: flavor, Listen: *listen, TokenFile: *tokenFile,
		Shards: *shards, Guilds: *guilds, MaxConcurrency: *maxConc, Traffic: *traffic,
		Ctl: *ctl, Stdout: stdout, Logger: log.With("component", "simulator"),
	})
}
