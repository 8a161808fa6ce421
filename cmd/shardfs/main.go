// Command shardfs keeps a chat bot's gateway shards alive and serves them as
// a file tree over 9P; it is also a small 9P client for that tree.
//
//	shardfs demo   [--flavor discord|fluxer] [--shards 4] [--listen ADDR]... [--chaos DURATION]
//	shardfs serve  --flavor discord|fluxer [--api URL] [--gateway URL] --total N|auto
//	               [--shards 0-3,7] [--intents N] [--listen ADDR[,ro][,insecure]]...
//	               [--sessions DIR [--resume-window D]]
//	               token: SHARDFS_TOKEN or --token-file FILE (never a flag value)
//	               listeners by default: unix socket read-write, tcp!127.0.0.1!5640,ro
//	               [--tls-cert F --tls-key F --tls-client-ca F]  (tls!HOST!PORT listeners)
//	shardfs netboot --out DIR [--kernel DIR] [--modules LIST] [--cmdline '...'] [--token-file F]
//	               [--tls-cert F --tls-key F --tls-client-ca F] [--etcd-ca F --etcd-cert F --etcd-key F]
//	               [--ca-bundle F] [--init F] [--dry-run]
//	shardfs mount  ADDR DIR [--ro] [--cert F --key F --ca F] [--aname /N] [--access UID|user|any]
//	shardfs certs  ca|server|client --dir DIR [--name NAME] [--host NAME|IP,...] [--days N]
//	shardfs ls|cat|write|tail [--addr ADDR] [--cert F --key F --ca F] PATH [TEXT]
//	shardfs supervise (serve's flags) --processes N | --shards-per-process K | --assign 'a=0-3;b=4-7'
//	               [--restart-max 3] [--restart-min-delay 1s] [--restart-max-delay 30s]
//	               [--healthy-reset 60s] [--startup-timeout 30s] [--shutdown-timeout 5s]
//	shardfs version
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
//
// With --sessions DIR, serve locks the folder before it discovers or
// connects, so a second serve on it fails at once and names the first's
// PID, and closes it only after the node's Close has saved every shard.
// For Fluxer it discovers before the start even with --total N: the core
// checks each Fluxer snapshot against the endpoint, which it must know
// before the first load. A failed early discovery is not fatal (a store
// problem never stops a shard): every Fluxer shard then starts a new
// session.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

func main() {
	if os.Getpid() == 1 {
		// The kernel ran the binary as /init of a netboot image. No
		// signal ends PID 1: it runs until the machine powers off.
		runPID1(context.Background(), os.Stderr)
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

const usage = `usage:
  shardfs demo   [--flavor discord|fluxer] [--shards 4] [--listen ADDR]... [--chaos DURATION]
  shardfs sim    [--flavor discord|fluxer] [--listen HOST:PORT] [--token-file FILE] [--shards N] [--guilds N] [--traffic PER_SECOND] [--ctl ADDR]
  shardfs serve  --flavor discord|fluxer [--api URL] [--gateway URL] --total N|auto
                 [--shards 0-3,7] [--intents N] [--listen ADDR[,ro][,insecure]]...
                 [--sessions DIR [--resume-window D]] [--metrics-listen HOST:PORT]
                 (token from SHARDFS_TOKEN or --token-file FILE; listens read-write
                 on its unix socket and read-only on tcp!127.0.0.1!5640 by default)
                 [--tls-cert F --tls-key F --tls-client-ca F]   (for tls!HOST!PORT listeners)
  shardfs netboot --out DIR [--kernel DIR] [--modules LIST] [--cmdline 'shardfs.x=y ...']
                 [--token-file FILE] [--tls-cert F --tls-key F --tls-client-ca F]
                 [--etcd-ca F --etcd-cert F --etcd-key F] [--ca-bundle FILE] [--init F] [--dry-run]
                 (a PXE image: boot.ipxe, initrd.cpio.gz with this binary as /init,
                 the kernel and its NIC modules; the TLS listener's files in
                 tls.cpio.gz, the token and etcd's TLS files in secrets.cpio.gz)
  shardfs mount  ADDR DIR [--ro] [--cert F --key F --ca F] [--aname /N] [--access UID|user|any]
  shardfs certs  ca|server|client --dir DIR [--name NAME] [--host NAME|IP,...] [--days N]
  shardfs ls     [--addr ADDR] [--cert F --key F --ca F] PATH
  shardfs cat    [--addr ADDR] [--cert F --key F --ca F] PATH
  shardfs write  [--addr ADDR] [--cert F --key F --ca F] PATH [TEXT]     (TEXT or standard input)
  shardfs tail   [--addr ADDR] [--cert F --key F --ca F] [-n LINES] [--once] PATH
  shardfs supervise (serve's flags) --processes N | --shards-per-process K | --assign 'a=0-3;b=4-7'
                 [--restart-max 3] [--restart-min-delay 1s] [--restart-max-delay 30s]
                 [--healthy-reset 60s] [--startup-timeout 30s] [--shutdown-timeout 5s]
  shardfs version
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "demo":
		return runDemo(ctx, args, stdout, stderr)
	case "sim":
		return runSim(ctx, args, stdout, stderr)
	case "serve":
		return runServe(ctx, args, stdout, stderr)
	case "netboot":
		return runNetboot(args, stdout, stderr)
	case "supervise":
		return runSupervise(ctx, args, stderr)
	case "ls", "cat", "write", "tail":
		return runClient(ctx, cmd, args, stdin, stdout, stderr)
	case "mount":
		return runMount(ctx, args, stdout, stderr)
	case "certs":
		return runCerts(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "shardfs", version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// version is the module version, or the VCS revision of a development
// build.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return "devel-" + rev + dirty
	}
	if v == "" {
		return "(devel)"
	}
	return v + " " + bi.GoVersion
}
