package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// config holds every size of the comparisons; the smoke test shrinks them.
type config struct {
	runs        int
	startupRuns int
	command     string // how the report says it was run

	ninepDuration time.Duration // per cat measurement
	diodloadSecs  int           // per diodload measurement
	requireDiod   bool          // fail instead of skipping when diod is missing

	memShards    int
	memBigShards int // shardfs alone
	memBigRuns   int
	memHeartbeat time.Duration

	dispatchShards   int
	dispatchPerShard int

	startupShards      int
	startupConcurrency int
	startupWindow      time.Duration

	recoveryShards  int
	recoveryTraffic float64       // events per second per shard
	recoverySettle  time.Duration // traffic before the drop and after the recovery

	observerShards   int
	observerStatus   int // clients polling status
	observerEvents   int // clients following events
	observerInterval time.Duration
	observerPhase    time.Duration
	observerFlapRate int // faults injected per second

	breakdown bool // the comparisons over TLS sum a further run's heap by package
	// memTLSHeartbeat is the heartbeat interval of the memory comparison
	// over TLS: longer than memHeartbeat, since thousands of TLS handshakes
	// on a loaded machine can hold a heartbeat past 1.5 intervals.
	memTLSHeartbeat time.Duration

	restart restartConfig
	reshard reshardConfig
	relay   relayConfig

	fleetFaults int // faults of the failover soak; 0 skips it (the smoke test)
	// fleetMembers is the soak's etcd cluster size (1 or 3; 3 adds the
	// member faults, soak.ClusterKinds); fleetTTL its --etcd-ttl (0: the
	// soak's 3 s).
	fleetMembers int
	fleetTTL     time.Duration
	// fleetHangBound is the soak's Config.HangBound: 0 makes a fault
	// that converges past TTL + 10 s end the run; longer lets the run go
	// on and count it (Report.OverBound).
	fleetHangBound time.Duration
	// fleetStopShards sizes the stop of a lone fleet node (0 skips it, the
	// smoke test); fleetStopRuns is how many times it runs.
	fleetStopShards, fleetStopRuns int

	only      map[string]bool
	loadStart string // /proc/loadavg when the run began
}

func defaultConfig() config {
	return config{
		runs:               5,
		startupRuns:        3,
		ninepDuration:      3 * time.Second,
		diodloadSecs:       3,
		memShards:          4096,
		memBigShards:       16384,
		memBigRuns:         3,
		memHeartbeat:       5 * time.Second,
		dispatchShards:     64,
		dispatchPerShard:   2000,
		startupShards:      256,
		startupConcurrency: 16,
		startupWindow:      5 * time.Second,
		recoveryShards:     1024,
		recoveryTraffic:    1,
		recoverySettle:     2 * time.Second,
		observerShards:     1024,
		observerStatus:     100,
		observerEvents:     100,
		observerInterval:   time.Second,
		observerPhase:      15 * time.Second,
		observerFlapRate:   200,
		breakdown:          true,
		memTLSHeartbeat:    10 * time.Second,
		restart:            defaultRestartConfig(),
		reshard:            defaultReshardConfig(),
		relay:              defaultRelayConfig(),
		fleetFaults:        100,
		fleetStopShards:    1024,
		fleetStopRuns:      3,
	}
}

// comparison is one section of the report.
type comparison struct {
	name  string
	title string
	run   func(cfg config, log io.Writer) (*section, error)
}

// fixedNumbers are the report's section numbers of the comparisons not
// numbered by their place: sections 12 to 14 of RESULTS.md are written
// by hand, so a later comparison takes a number after them.
var fixedNumbers = map[string]int{"relay": 15}

// sectionNumber is the report's number of comparisons[i].
func sectionNumber(i int) int {
	if n := fixedNumbers[comparisons[i].name]; n != 0 {
		return n
	}
	return i + 1
}

var comparisons = []comparison{
	{"9p", "9P serving: shardfs vs diod", run9P},
	{"memory", "Memory per idle shard: shardfs vs discordgo vs disgo", runMemory},
	{"dispatch", "Dispatch throughput: shardfs vs discordgo vs disgo", runDispatch},
	{"startup", "Startup pacing: shardfs (disgo beside it)", runStartup},
	{"recovery", "Mass recovery: shardfs vs disgo", runRecovery},
	{"observer", "Observer load: the core's event latency", runObserver},
	{"memory-tls", "Memory per idle shard over TLS: shardfs vs discordgo vs disgo", runMemoryTLS},
	{"dispatch-tls", "Dispatch throughput over TLS with zlib-stream: shardfs vs discordgo vs disgo", runDispatchTLS},
	{"restart", "Restarts: resume vs cold start (serve --sessions)", runRestart},
	{"reshard", "A larger plan without downtime: 4011 to the switch (serve --total auto)", runReshard},
	{"fleet", "Failover soak: three nodes sharing one bot through etcd", runFleet},
	{"relay", "Gateway relay: discordgo through serve --relay vs straight to the simulator", runRelay},
}

// groups are names -only accepts for several comparisons.
var groups = map[string][]string{"tls": {"memory-tls", "dispatch-tls"}}

func comparisonNames() []string {
	var out []string
	for _, c := range comparisons {
		out = append(out, c.name)
	}
	return out
}

// run runs the comparisons cfg selects and returns the report. A
// comparison that fails is reported as failed and the others still run.
func run(cfg config, log io.Writer) (string, error) {
	var sections []*section
	var errs []error
	for i, c := range comparisons {
		if cfg.only != nil && !cfg.only[c.name] {
			continue
		}
		fmt.Fprintf(log, "bench: %s ...\n", c.title)
		start := time.Now()
		s, err := c.run(cfg, log)
		if s == nil {
			s = &section{}
		}
		s.number, s.title = sectionNumber(i), c.title
		s.elapsed = time.Since(start)
		if err != nil {
			s.failed = err.Error()
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
		fmt.Fprintf(log, "bench: %s done in %v\n", c.name, s.elapsed.Round(time.Second))
		sections = append(sections, s)
	}
	return render(cfg, machineInfo(), sections), errors.Join(errs...)
}

// selectedNumbers are the section numbers of the comparisons cfg runs.
func selectedNumbers(cfg config) []int {
	var out []int
	for i, c := range comparisons {
		if cfg.only == nil || cfg.only[c.name] {
			out = append(out, sectionNumber(i))
		}
	}
	return out
}

// provenance is the line a merged report gets about the sections merged in.
func provenance(cfg config, took time.Duration) string {
	var nums []string
	for _, n := range selectedNumbers(cfg) {
		nums = append(nums, strconv.Itoa(n))
	}
	s := fmt.Sprintf("Merged: sections %s from `%s` on %s, which took %v.", strings.Join(nums, ", "), cfg.command,
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), took.Round(time.Second))
	if l := loadText(cfg.loadStart, loadAverage()); l != "" {
		s += " " + l
	}
	return s
}
