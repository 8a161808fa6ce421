// Package simctl runs the gateway simulator as a program, `shardfs sim`:
// it serves the bot's API and gateway on an address, keeps the bot's
// token in a file that serve can read, and takes faults on a 9P control
// tree.
//
// Decisions. The token is never printed: it is read from the token file,
// or, when that file does not exist, made at random and written there
// (mode 0600, never over an existing file), so that `shardfs serve
// --token-file` reads the same file and a newcomer copies no secret
// through a terminal. The control surface is a 9P tree (package fsrv),
// as shardfs's own: ctl takes one command a line, status shows what the
// simulator sees, and events says what each command did or why it was
// refused (under 9P2000.L an error is an errno alone). It listens on a
// unix socket only its owner can use by default, since it can revoke the
// token and drop every connection. The simulator imports neither the
// lifecycle core nor the gateway client, so this package does not
// either.
package simctl

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// DefaultListen is where the simulator serves its API and gateway.
const DefaultListen = "127.0.0.1:7000"

// Config configures a simulator run. The zero value (with TokenFile and
// Ctl set, as the command's defaults do) is a one-shard Discord bot on
// DefaultListen.
type Config struct {
	Flavor gatewaysim.Flavor
	// Listen is the API's and gateway's TCP address (default
	// DefaultListen).
	Listen string
	// TokenFile holds the bot's token; one is made when it does not
	// exist.
	TokenFile string
	// Shards is the shard count discovery recommends (default 1); Guilds
	// is how many guilds the bot is in (default 2 per shard).
	Shards, Guilds int
	// MaxConcurrency is Discord's identify concurrency (default 1).
	MaxConcurrency int
	// Traffic is MESSAGE_CREATE events per second per shard.
	Traffic float64
	// Ctl is the control tree's 9P listen address (fsrv.Listen's forms).
	Ctl string
	// Sim tunes the simulator further (tests shorten its timers); the
	// fields above replace its own.
	Sim gatewaysim.Config
	// Ready, when set, receives the running simulator and its control
	// surface once both serve.
	Ready func(*gatewaysim.Server, *Control)
	// Stdout receives the how-to; nil discards it.
	Stdout io.Writer
	Logger *slog.Logger
}

// DefaultTokenFile and DefaultCtl are the token file and the control
// socket when not given: in fsrv.RuntimeDir (never the temporary
// folder, where another user could plant a token file or a socket first),
// named for the user.
func DefaultTokenFile() string { return runtimePath("shardfs-sim-%d.token") }

// DefaultCtl is the control tree's unix socket when not given.
func DefaultCtl() string { return "unix!" + runtimePath("shardfs-sim-%d.sock") }

func runtimePath(format string) string {
	return filepath.Join(fsrv.RuntimeDir(), fmt.Sprintf(format, os.Getuid()))
}

// Run serves the simulator until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.TokenFile == "" {
		return errors.New("sim: no token file")
	}
	if filepath.Dir(cfg.TokenFile) == fsrv.RuntimeDir() {
		if err := fsrv.EnsureRuntimeDir(); err != nil {
			return fmt.Errorf("sim: --token-file: %w", err)
		}
	}
	token, made, err := TokenFrom(cfg.TokenFile)
	if err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := cfg.Stdout
	if out == nil {
		out = io.Discard
	}
	sc := cfg.Sim
	sc.Flavor, sc.Token, sc.Addr = cfg.Flavor, token, cfg.Listen
	if sc.Addr == "" {
		sc.Addr = DefaultListen
	}
	sc.Shards = max(cfg.Shards, 1)
	sc.Guilds = cfg.Guilds
	if sc.Guilds <= 0 {
		sc.Guilds = 2 * sc.Shards
	}
	if cfg.MaxConcurrency > 0 {
		sc.MaxConcurrency = cfg.MaxConcurrency
	}
	sc.Traffic = gatewaysim.Traffic{PerShard: max(cfg.Traffic, 0)}
	sc.Logger = log
	sim, err := gatewaysim.New(sc)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	defer sim.Close()
	ctl := NewControl(sim, token)
	l, err := fsrv.Listen(cfg.Ctl)
	if err != nil {
		return fmt.Errorf("sim: --ctl: %w", err)
	}
	srv := &fsrv.Server{Root: ctl.Root(), Logger: log.With("component", "9p")}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()

	made1 := ""
	if made {
		made1 = " (made now, mode 0600)"
	}
	api, ctlAddr := sim.APIURL(), ctlAddress(l)
	fmt.Fprintf(out, "shardfs sim: a %s gateway for a bot of %d shard(s) and %d guilds at %s\n", cfg.Flavor, sc.Shards, sc.Guilds, api)
	fmt.Fprintf(out, "the bot's token is in %s%s; it is never printed\n\n", cfg.TokenFile, made1)
	intents := ""
	if cfg.Flavor == gatewaysim.Discord {
		// GUILDS and GUILD_MESSAGES: the simulator's traffic reaches a
		// Discord session only with them.
		intents = fmt.Sprintf(" --intents %d", gatewaysim.IntentGuilds|gatewaysim.IntentGuildMessages)
	}
	fmt.Fprintf(out, "run a node against it:\n  shardfs serve --flavor %s --api %s --token-file %s --total auto%s\n\n", cfg.Flavor, api, cfg.TokenFile, intents)
	fmt.Fprintf(out, "misbehave (one command a line; cat ctl lists them; events says what each did):\n")
	fmt.Fprintf(out, "  shardfs write --addr '%s' ctl 'close 0 4000'\n", ctlAddr)
	fmt.Fprintf(out, "  shardfs cat --addr '%s' status\n", ctlAddr)
	fmt.Fprintf(out, "Ctrl-C stops.\n")
	if cfg.Ready != nil {
		cfg.Ready(sim, ctl)
	}
	select {
	case err = <-served:
		if errors.Is(err, fsrv.ErrServerClosed) {
			err = nil
		}
		return err
	case <-ctx.Done():
	}
	srv.Close()
	<-served
	return nil
}

// ctlAddress is the dial string of the control listener, as the
// client's --addr takes it.
func ctlAddress(l net.Listener) string {
	a := l.Addr()
	if a.Network() == "unix" {
		return "unix!" + a.String()
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return "tcp!" + host + "!" + port
}

// TokenFrom reads the token in file, or makes one and writes it there
// (0600) when the file does not exist; made says which.
func TokenFrom(file string) (token string, made bool, err error) {
	b, err := os.ReadFile(file)
	switch {
	case err == nil:
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", false, fmt.Errorf("sim: --token-file %s is empty: remove it and a token is made there", file)
		}
		return token, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("sim: --token-file: %w", err)
	}
	token = "sim." + crand.Text()
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("sim: --token-file: %w", err)
	}
	_, err = f.WriteString(token + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(file)
		return "", false, fmt.Errorf("sim: --token-file: %w", err)
	}
	return token, true, nil
}
