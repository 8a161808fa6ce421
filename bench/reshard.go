package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// reshardConfig sizes the reshard comparison: each old total moves to
// twice as many shards (rounded up to a multiple of max_concurrency, as
// Discord requires of large bots). The zero value is the smoke test's.
type reshardConfig struct {
	totals      []int
	concurrency int
	rate        int // guild events per second, over every guild
	// settle is how long the memory is sampled and copies counted after
	// the switch: the Cut matches stragglers for 30 s (reshard.Window).
	settle time.Duration
}

func (c reshardConfig) withDefaults() reshardConfig {
	if len(c.totals) == 0 {
		c.totals, c.concurrency = []int{4}, 4
	}
	if c.concurrency <= 0 {
		c.concurrency = 16
	}
	if c.rate <= 0 {
		c.rate = 200
	}
	if c.settle <= 0 {
		c.settle = 5 * time.Second
	}
	return c
}

func defaultReshardConfig() reshardConfig {
	return reshardConfig{totals: []int{16, 256}, concurrency: 16, rate: 500, settle: 30 * time.Second}
}

const colReshard = "shardfs"

// readTree reads one file of serve's tree over its unix socket.
func readTree(sock, name string) ([]byte, error) {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	cl, err := p9.NewClient(conn, p9.WithMessageSize(256<<10))
	if err != nil {
		conn.Close()
		return nil, err
	}
	defer cl.Close()
	root, err := cl.Attach("")
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return readFile(root, name)
}

// keyValue reads the value of key in key value lines.
func keyValue(text []byte, key string) string {
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return v
		}
	}
	return ""
}

// grown is the new total of a move from n: twice n, rounded up to a
// multiple of mc.
func grown(n, mc int) int { return (2*n + mc - 1) / mc * mc }

type reshardResult struct {
	toSwitch time.Duration // the 4011 to the switch
	bound    time.Duration // ceil(new / max_concurrency) × 5 s
	both     int64         // events the simulator sent to both plans
	dropped  int64         // copies the node recognised at the switch
	// droppedLater is copies_dropped once the settle time has passed.
	droppedLater int64
	// heldAtSwitch is what the Cut held at the switch and released at
	// once (the events in flight); heldMax the most /reshard showed held
	// while polling.
	heldAtSwitch, heldMax int64
	// The baseline: serve's VmRSS at its start and peak over as long as
	// the move's sampling, same traffic, no move.
	rssBase, rssBasePeak int64
	// The move: VmRSS at the 4011 and its peak until settle after the
	// switch.
	rssBefore, rssPeak int64
	rssPeakSwitch      int64 // the peak until the switch
	identifies         int64
	refused            int64 // identifies the simulator refused during the move
}

// reshardRun starts n shards with serve --total auto, lets guild traffic
// flow, makes discovery recommend 2n and closes shard 0 with 4011, and
// times the move.
func reshardRun(bin string, n, mc, rate int, settle time.Duration, log io.Writer) (reshardResult, error) {
	var r reshardResult
	tmp, tokenFile, done, err := tempWithToken("shardfs-bench-reshard-")
	if err != nil {
		return r, err
	}
	defer done()
	next := grown(n, mc)
	guilds := 4 * next // four guilds on every shard of the new plan
	s, err := startSim(n, "-max-concurrency", strconv.Itoa(mc), "-identify-interval", "5s", "-guilds", strconv.Itoa(guilds))
	if err != nil {
		return r, err
	}
	defer s.close()
	sock := filepath.Join(tmp, "sock")
	cmd := exec.Command(bin, "serve", "--flavor", "discord", "--api", s.api, "--total", "auto",
		"--listen", "unix!"+sock, "--token-file", tokenFile)
	cmd.Env = os.Environ()
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return r, err
	}
	p := &serveProc{cmd: cmd, stderr: stderr, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	defer p.kill()
	if err := waitReady(sock, n, time.Duration(n/mc+2)*5*time.Second+time.Minute); err != nil {
		return r, fmt.Errorf("%w (serve: %s)", err, stderr)
	}
	if _, err := s.call(time.Minute, "guilds %d %d", rate, guilds); err != nil {
		return r, err
	}
	time.Sleep(2 * time.Second) // traffic flowing before the move
	rounds := (next + mc - 1) / mc
	r.bound = time.Duration(rounds) * 5 * time.Second
	// The baseline: the same traffic, no move, sampled as long as the
	// move will be (its bound and the settle time).
	if r.rssBase, err = rss(cmd.Process.Pid); err != nil {
		return r, err
	}
	r.rssBasePeak = r.rssBase
	for end := time.Now().Add(r.bound + settle); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if v, err := rss(cmd.Process.Pid); err == nil && v > r.rssBasePeak {
			r.rssBasePeak = v
		}
	}
	if r.rssBefore, err = rss(cmd.Process.Pid); err != nil {
		return r, err
	}
	before, err := s.totals()
	if err != nil {
		return r, err
	}
	if _, err := s.call(time.Minute, "grow %d", 2*n); err != nil {
		return r, err
	}
	start := time.Now()
	if _, err := s.call(time.Minute, "close 0 4011"); err != nil {
		return r, err
	}
	deadline := start.Add(r.bound + 2*time.Minute)
	r.rssPeak = r.rssBefore
	sample := func() {
		if v, err := rss(cmd.Process.Pid); err == nil && v > r.rssPeak {
			r.rssPeak = v
		}
	}
	var text []byte
	for {
		sample()
		text, err = readTree(sock, "reshard")
		if err == nil && keyValue(text, "state") == "switched" {
			r.toSwitch = time.Since(start)
			r.rssPeakSwitch = r.rssPeak
			break
		}
		if err == nil && (keyValue(text, "state") == "refused" || keyValue(text, "state") == "aborted") {
			return r, fmt.Errorf("the move ended %s: %s", keyValue(text, "state"), keyValue(text, "reason"))
		}
		if h, err := strconv.ParseInt(keyValue(text, "held"), 10, 64); err == nil && h > r.heldMax {
			r.heldMax = h
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("no switch within %v: /reshard %q, %v (serve: %s)", deadline.Sub(start), text, err, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.dropped, _ = strconv.ParseInt(keyValue(text, "copies_dropped"), 10, 64)
	r.heldAtSwitch, _ = strconv.ParseInt(keyValue(text, "held_at_switch"), 10, 64)
	// The Cut lives on for its window: keep sampling, then count the
	// copies recognised by then.
	for end := time.Now().Add(settle); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		sample()
	}
	if text, err = readTree(sock, "reshard"); err != nil {
		return r, err
	}
	r.droppedLater, _ = strconv.ParseInt(keyValue(text, "copies_dropped"), 10, 64)
	if ev, err := readTree(sock, "events"); err == nil && os.Getenv("SHARDFS_BENCH_EVENTS") != "" {
		fmt.Fprintf(log, "%s", ev)
	}
	v, err := s.callInts(time.Minute, "guilds 0 1")
	if err != nil {
		return r, err
	}
	r.both = v[1]
	after, err := s.totals()
	if err != nil {
		return r, err
	}
	r.identifies = after.Identifies - before.Identifies
	r.refused = after.RefusedIdentifies - before.RefusedIdentifies
	fmt.Fprintf(log, "bench: reshard %d -> %d: switch after %v (bound %v), %d held at the switch (%d at most while polling), %d events sent to both plans, %d copies recognised at the switch, %d after %v, RSS %d -> peak %d KiB at the switch, %d KiB after (baseline %d -> peak %d KiB), %d identifies, %d refused\n",
		n, next, r.toSwitch.Round(time.Millisecond), r.bound, r.heldAtSwitch, r.heldMax, r.both, r.dropped, r.droppedLater, settle,
		r.rssBefore>>10, r.rssPeakSwitch>>10, r.rssPeak>>10, r.rssBase>>10, r.rssBasePeak>>10, r.identifies, r.refused)
	if _, err := p.stop(); err != nil {
		return r, err
	}
	return r, nil
}

func runReshard(cfg config, log io.Writer) (*section, error) {
	rc := cfg.reshard.withDefaults()
	sec := &section{columns: []string{colReshard}}
	bin, done, err := buildServeTemp()
	if err != nil {
		return sec, err
	}
	defer done()
	for _, n := range rc.totals {
		next := grown(n, rc.concurrency)
		r, err := reshardRun(bin, n, rc.concurrency, rc.rate, rc.settle, log)
		if err != nil {
			return sec, fmt.Errorf("%d -> %d shards: %w", n, next, err)
		}
		within := r.toSwitch <= r.bound+5*time.Second
		sec.add(row{
			measure: fmt.Sprintf("4011 to the switch, %d -> %d shards, max_concurrency %d", n, next, rc.concurrency), unit: "s",
			values: map[string][]float64{colReshard: {r.toSwitch.Seconds()}}, digits: 1,
			ratio:  fmt.Sprintf("%.2f× the identify limit of %v", r.toSwitch.Seconds()/r.bound.Seconds(), r.bound),
			target: "within the identify limit ceil(new / max_concurrency) × 5 s, plus one window",
			met:    boolp(within),
		})
		sec.add(row{
			measure: fmt.Sprintf("events in flight at the switch (held by the cut, released at once), %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.heldAtSwitch)}},
			ratio:   fmt.Sprintf("at most %d held while polling the move", r.heldMax),
		})
		// A copy is missing from the count only when the old connection
		// closed before the simulator wrote its old twin: the new plan's
		// copy is then the one delivered (at most the traffic of the
		// moment of the close).
		sec.add(row{
			measure: fmt.Sprintf("events sent to both plans during the move, %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.both)}},
			ratio:   fmt.Sprintf("%d recognised as copies at the switch, %d after %v", r.dropped, r.droppedLater, rc.settle),
			target:  "every copy recognised within the window, but those whose old twin the closing connection never got (≤ 1%)",
			met:     boolp(r.droppedLater <= r.both && r.both-r.droppedLater <= r.both/100),
		})
		extra, base := (r.rssPeak-r.rssBefore)>>10, (r.rssBasePeak-r.rssBase)>>10
		sec.add(row{
			measure: fmt.Sprintf("extra resident memory while both plans run, %d -> %d", n, next), unit: "KiB",
			values: map[string][]float64{colReshard: {float64(extra)}},
			ratio: fmt.Sprintf("baseline, same traffic and time without a move: %d KiB; the move's own %d KiB (%.1f KiB per new shard); until the switch %d KiB",
				base, extra-base, float64(extra-base)/float64(next), (r.rssPeakSwitch-r.rssBefore)>>10),
		})
		sec.add(row{
			measure: fmt.Sprintf("identifies for the move, %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.identifies)}},
			target:  "one per new shard", met: boolp(r.identifies == int64(next)),
		})
		sec.add(row{
			measure: fmt.Sprintf("identifies refused (op 9) during the move, %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.refused)}},
			target:  "none", met: boolp(r.refused == 0),
		})
	}
	sec.method = []string{
		"Each size starts a fresh simulator (Discord flavour, the real identify rule at max_concurrency " + strconv.Itoa(rc.concurrency) + ", four guilds on every shard of the larger plan) " +
			"and the real binary, `shardfs serve --flavor discord --total auto`, built from this tree. Once every shard is READY, the simulator publishes " + strconv.Itoa(rc.rate) + " MESSAGE_CREATEs a second over the guilds, " +
			"each to every session its guild routes to (both plans during the move, as Discord does), then discovery is made to recommend twice the shards (serve rounds it up to a multiple of max_concurrency) and shard 0 is closed with 4011. " +
			"The time runs from that close to the moment serve's /reshard says switched (polled every 100 ms over 9P); the 4011 comes after the baseline, when every bucket's last identify is older than 5 s, so the new plan's first round identifies at once and the switch comes about a second after its last round starts, ceil(new / max_concurrency) − 1 windows after the 4011. " +
			"The events in flight at the switch are /reshard's held_at_switch: the new plan's events the cut held and released at the switch (the new sessions' READY and GUILD_CREATEs, the guilds of the 4011 shard, copies whose old twin had not arrived). " +
			"The memory is serve's VmRSS at the 4011 and its peak until the switch and until " + rc.settle.String() + " after it (the cut matches stragglers for 30 s, the held events go into the new plan's logs at the switch, the old plan is ended then but not yet collected); the baseline is the same process, same traffic, sampled as long (the identify limit plus " + rc.settle.String() + ") just before the 4011, without a move. " +
			"Events sent to both plans are the simulator's count; the copies recognised are /reshard's copies_dropped at the switch and " + rc.settle.String() + " later. " +
			"Each figure is one run: a run of 256 -> 512 takes about 8 minutes." +
			" VmRSS includes garbage the Go collector has not reclaimed yet (at the default GOGC the heap grows to twice the live heap before a collection), so the extra memory bounds the move's cost from above.",
	}
	return sec, nil
}
