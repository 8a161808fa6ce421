// Command shardfs keeps a chat bot's gateway shards alive and serves them as
// a file tree over 9P; it is also a small 9P client for that tree.
// `shardfs help` prints its usage, `shardfs COMMAND -h` a command's flags.
//
// Each command parses its flags and calls one Run of a package: serve
// node.Run, supervise supervisor.Run, demo demo.Run.
//
// Decisions. When serve takes its token from SHARDFS_TOKEN it re-executes
// itself in place (same PID, so signals and the exit status are
// unchanged) without the variable, handing the token over on a pipe
// (token.go); Unsetenv alone leaves it in /proc/PID/environ. On a
// terminal, one goroutine (the log queue's writer) owns stderr: the
// startup progress line goes through the same queue as the log lines, and
// each log line erases it and draws it again below itself (console in
// asynclog.go); a terminal progress library would bring its own render
// loop and a second writer to keep in step with the queue, for one line.
// A burst of log lines with the same long err (shards that shared one
// failed discovery) prints it whole once and "same as shard N" after; the
// tree's events keep every shard's full text.
//
// Run as PID 1 (the /init of a netboot image), the binary boots the node
// (package baremetal, pid1.go) whatever its arguments. Without a token it
// still serves the tree, its shards FATAL with "no token". netboot puts
// the running binary in the image, so it must be static (CGO_ENABLED=0);
// it refuses a dynamic one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
)

func main() {
	if os.Getpid() == 1 {
		// The kernel ran the binary as /init of a netboot image. No
		// signal ends PID 1: it runs until the machine powers off.
		runPID1(context.Background(), os.Stdin, os.Stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "shardfs:", err)
		}
		os.Exit(1)
	}
}

// usage is the one usage text: a test checks that it names every flag
// each command registers, and no other. A new command goes into commands
// and here, a new flag into its command's lines.
const usage = `usage: shardfs COMMAND [flags]   (shardfs COMMAND -h describes each flag)
  shardfs demo   [--flavor discord|fluxer] [--shards 4] [--traffic 1] [--chaos DURATION]
                 [--compress none|zlib-stream|zstd-stream] [--debug]
                 [--listen ADDR]... [--tls-cert F --tls-key F --tls-client-ca F]
  shardfs sim    [--flavor discord|fluxer] [--listen HOST:PORT] [--token-file FILE] [--shards N]
                 [--guilds N] [--max-concurrency N] [--traffic PER_SECOND] [--ctl ADDR] [--debug]
  shardfs serve  --flavor discord|fluxer --total N|auto [--shards 0-3,7]
                 [--api URL] [--gateway URL] [--intents N]
                 [--compress none|zlib-stream|zstd-stream] [--backoff default|fixed:DURATION]
                 [--max-concurrency N] [--identify-total N] [--identify-reserve -1|0|N]
                 [--listen ADDR[,ro][,insecure][,max=N]]... [--max-conns N] [--idle-timeout 10m]
                 [--tls-cert F --tls-key F --tls-client-ca F] [--tls-deny FILE]
                 (for tls!HOST!PORT[,ca=FILE][,clients=FILE] listeners; SIGHUP reads them again)
                 [--sessions DIR [--resume-window D]] [--metrics-listen HOST:PORT] [--debug]
                 [--relay ADDR]... [--relay-resume-window 60s] [--relay-cache KIND,...|none]
                 [--etcd URL,... --bot NAME [--node NAME] [--etcd-ttl D]
                  [--etcd-ca F --etcd-cert F --etcd-key F] [--etcd-insecure]
                  [--etcd-user NAME [--etcd-password-file F]] [--fluxer-identify-budget N]
                  [--confirm-delivery=false]]
                 (the etcd password from --etcd-password-file or SHARDFS_ETCD_PASSWORD)
                 (token from SHARDFS_TOKEN or --token-file FILE; listens read-write
                 on its unix socket and read-only on tcp!127.0.0.1!5640 by default)
  shardfs supervise (serve's flags, but for --shards and the etcd ones)
                 --processes N | --shards-per-process K | --assign 'a=0-3;b=4-7'
                 [--restart-max 3] [--restart-min-delay 1s] [--restart-max-delay 30s]
                 [--healthy-reset 60s] [--startup-timeout 30s] [--shutdown-timeout 20s]
                 [--watchdog 10s] [--fail-all]
  shardfs netboot --out DIR [--kernel DIR] [--modules LIST] [--cmdline 'shardfs.x=y ...']
                 [--enroll-ca F] [--ca-bundle FILE] [--init F] [--dry-run]
                 (a PXE image: boot.ipxe, initrd.cpio.gz with this binary as /init,
                 the kernel and its NIC modules; no secret: the node enrolls)
          netboot --serve HOST:PORT --enroll-cert F --enroll-key F --node-ca BASE
                 --tls-client-ca F [--node-names FILE] [--token-file FILE]
                 [--etcd-ca F --etcd-cert F --etcd-key F] [--enroll-code FILE] [--code-ttl D]
                 [--max-pending N] [--listen ADDR]...
                 (the enrollment server: nodes wait in /enroll/pending until
                 echo approve FINGERPRINT > /enroll/ctl, or show a one-time code)
  shardfs fleet  plan --etcd URL,... --bot NAME [--total N [--flavor discord|fluxer]]
                 [--etcd-ca F --etcd-cert F --etcd-key F] [--etcd-insecure]
                 [--etcd-user NAME [--etcd-password-file F]]
                 (prints the bot's plan in etcd; with --total writes a new one,
                 refused while any node of the bot runs)
  shardfs mount  ADDR DIR [--ro] [--cert F --key F --ca F] [--aname /N] [--access UID|user|any]
  shardfs certs  ca|server|client --dir DIR [--name NAME] [--host NAME|IP,...] [--days N]
  shardfs ls     [--addr ADDR] [--cert F --key F --ca F] [PATH]
  shardfs cat    [--addr ADDR] [--cert F --key F --ca F] PATH
  shardfs write  [--addr ADDR] [--cert F --key F --ca F] PATH [TEXT]     (TEXT or standard input)
  shardfs tail   [--addr ADDR] [--cert F --key F --ca F] [-n LINES] [--once] PATH
  shardfs version
  shardfs help
`

// subcommand runs one command with its arguments.
type subcommand func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error

// commands are the subcommands but help. Each parses its flags and calls
// one Run of a package.
var commands = map[string]subcommand{
	"demo": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runDemo(ctx, args, stdout, stderr)
	},
	"sim": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runSim(ctx, args, stdout, stderr)
	},
	"serve": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runServe(ctx, args, stdout, stderr)
	},
	"supervise": func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
		return runSupervise(ctx, args, stderr)
	},
	"netboot": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runNetboot(ctx, args, stdout, stderr)
	},
	"mount": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runMount(ctx, args, stdout, stderr)
	},
	"fleet": func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runFleet(ctx, args, stdout, stderr)
	},
	"certs": func(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
		return runCerts(args, stdout, stderr)
	},
	"ls":    clientCommand("ls"),
	"cat":   clientCommand("cat"),
	"write": clientCommand("write"),
	"tail":  clientCommand("tail"),
	"version": func(_ context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) error {
		bi, _ := debug.ReadBuildInfo()
		fmt.Fprintln(stdout, "shardfs", version(bi))
		return nil
	},
}

func clientCommand(name string) subcommand {
	return func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
		return runClient(ctx, name, args, stdin, stdout, stderr)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	name, args := args[0], args[1:]
	if cmd, ok := commands[name]; ok {
		return cmd(ctx, args, stdin, stdout, stderr)
	}
	switch name {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", name)
}

// version says which shardfs this is: the module version (what go
// install ...@VERSION built), or for a build from a checkout "devel" with
// the VCS revision, "+dirty" when the tree had changes, and the commit
// time; then the Go version and the platform. bi is nil when the binary
// carries no build information.
func version(bi *debug.BuildInfo) string {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if bi == nil {
		return "unknown " + runtime.Version() + " " + platform
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
		var rev, dirty, at string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			case "vcs.time":
				at = s.Value
			}
		}
		if rev != "" {
			v += " " + rev[:min(len(rev), 12)] + dirty
		}
		if at != "" {
			v += " " + at
		}
	}
	return v + " " + bi.GoVersion + " " + platform
}
