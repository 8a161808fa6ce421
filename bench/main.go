// Command bench runs shardfs side by side with the tools its users would
// pick instead, and prints a Markdown report that it also writes to
// RESULTS.md:
//
//	cd bench && go run . -runs 5
//
// It compares 9P serving against diod, the memory of idle shards and the
// dispatch throughput against discordgo and disgo (plain, then over TLS
// with a CA made for the run, shardfs also with zlib-stream), and measures
// startup pacing, mass recovery (beside disgo) and the core's event latency
// under observer load. -only runs some comparisons and merges their
// sections into the existing report; the TLS ones alone, as after a change
// to the gateway:
//
//	cd bench && go run . -only tls -runs 5
//
// Every side, and the gateway simulator, runs in a process of its own (the
// harness re-executes itself in a role), so that resident memory and CPU
// time read from /proc/PID are charged to the right side; the runs of the
// sides are interleaved, A B A B.
//
// It is a module of its own so that the peer libraries never enter
// shardfs's go.mod.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/shardfs/shardfs/soak"
)

// verbose copies the children's stderr to ours.
var verbose bool

func main() {
	soak.MaybeRunEtcd()
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role, os.Args[1:]))
	}
	if len(os.Args) > 1 && isRole(os.Args[1]) {
		os.Exit(runChild(os.Args[1], os.Args[2:]))
	}
	cfg := defaultConfig()
	out := flag.String("out", "RESULTS.md", "where to write the report")
	only := flag.String("only", "", "comma-separated comparisons to run: "+strings.Join(comparisonNames(), ",")+", or tls for memory-tls,dispatch-tls")
	flag.IntVar(&cfg.runs, "runs", cfg.runs, "runs of each side of each comparison (at least 5 for the report)")
	flag.IntVar(&cfg.startupRuns, "startup-runs", cfg.startupRuns, "runs of each side of the startup pacing comparison (about 80 s each)")
	flag.IntVar(&cfg.memBigRuns, "mem-big-runs", cfg.memBigRuns, "runs of shardfs alone at the larger scale")
	flag.DurationVar(&cfg.observerInterval, "observer-interval", cfg.observerInterval, "how often each observer polls")
	flag.IntVar(&cfg.fleetFaults, "fleet-faults", cfg.fleetFaults, "faults of the failover soak")
	flag.IntVar(&cfg.fleetMembers, "fleet-etcd-members", 1, "etcd members of the failover soak: 1, or 3 to add the member faults (killed, leader killed, partitioned)")
	flag.DurationVar(&cfg.fleetTTL, "fleet-ttl", 0, "--etcd-ttl of the failover soak (0: 3s)")
	flag.IntVar(&cfg.fleetStopShards, "fleet-stop-shards", cfg.fleetStopShards, "shards of the lone fleet node whose stop is timed")
	flag.IntVar(&cfg.fleetStopRuns, "fleet-stop-runs", cfg.fleetStopRuns, "runs of the lone fleet node's stop")
	flag.DurationVar(&cfg.fleetHangBound, "fleet-hang-bound", 0, "how long the failover soak waits for a fault to converge before it ends the run (0: the bound, TTL + 10 s); a longer wait counts the faults over the bound and goes on")
	flag.DurationVar(&cfg.relay.phase, "relay-phase", cfg.relay.phase, "traffic per phase of the relay comparison")
	flag.BoolVar(&verbose, "v", false, "copy the children's stderr to ours")
	merge := flag.Bool("merge", true, "with -only, put the comparisons run into the existing -out file, replacing their sections and summary rows and keeping the others")
	flag.Parse()
	if *only != "" {
		cfg.only = map[string]bool{}
		for _, name := range strings.Split(*only, ",") {
			name = strings.TrimSpace(name)
			cfg.only[name] = true
			for _, n := range groups[name] {
				cfg.only[n] = true
			}
		}
	}
	cfg.requireDiod = os.Getenv("CI") == "true"
	cfg.command = "cd bench && go run ." + strings.TrimPrefix(strings.Join(append([]string{""}, os.Args[1:]...), " "), "")
	start := time.Now()
	cfg.loadStart = loadAverage()
	report, err := run(cfg, os.Stderr)
	if report != "" {
		old, rerr := os.ReadFile(*out)
		if cfg.only != nil && *merge && rerr == nil {
			report = mergeReport(string(old), report, selectedNumbers(cfg), provenance(cfg, time.Since(start)))
		} else {
			report += fmt.Sprintf("\n%s %v of wall time.\n", footerPrefix, time.Since(start).Round(time.Second))
		}
		fmt.Print(report)
		if werr := os.WriteFile(*out, []byte(report), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "bench:", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var roles = map[string]func([]string) error{
	"sim":          runSim,
	"shardfs-node": runNode,
	"discordgo":    runDiscordgo,
	"disgo":        runDisgo,
	"echo":         runEcho,
}

func isRole(name string) bool { return roles[name] != nil }

// runChild plays a role until its stdin ends.
func runChild(role string, args []string) int {
	f := roles[role]
	if f == nil {
		fmt.Fprintf(os.Stderr, "bench: unknown role %q\n", role)
		return 2
	}
	if err := f(args); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", role, err)
		return 1
	}
	return 0
}
