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
	return c
}

func defaultReshardConfig() reshardConfig {
	return reshardConfig{totals: []int{16, 256}, concurrency: 16, rate: 500}
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
	toSwitch   time.Duration // the 4011 to the switch
	bound      time.Duration // ceil(new / max_concurrency) × 5 s
	both       int64         // events the simulator sent to both plans
	dropped    int64         // copies the node recognised
	rssBefore  int64
	rssPeak    int64
	identifies int64
}

// reshardRun starts n shards with serve --total auto, lets guild traffic
// flow, makes discovery recommend 2n and closes shard 0 with 4011, and
// times the move.
func reshardRun(bin string, n, mc, rate int, log io.Writer) (reshardResult, error) {
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
	rounds := (next + mc - 1) / mc
	r.bound = time.Duration(rounds) * 5 * time.Second
	deadline := start.Add(r.bound + 2*time.Minute)
	r.rssPeak = r.rssBefore
	var text []byte
	for {
		if v, err := rss(cmd.Process.Pid); err == nil && v > r.rssPeak {
			r.rssPeak = v
		}
		text, err = readTree(sock, "reshard")
		if err == nil && keyValue(text, "state") == "switched" {
			r.toSwitch = time.Since(start)
			break
		}
		if err == nil && (keyValue(text, "state") == "refused" || keyValue(text, "state") == "aborted") {
			return r, fmt.Errorf("the move ended %s: %s", keyValue(text, "state"), keyValue(text, "reason"))
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("no switch within %v: /reshard %q, %v (serve: %s)", deadline.Sub(start), text, err, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.dropped, _ = strconv.ParseInt(keyValue(text, "copies_dropped"), 10, 64)
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
	fmt.Fprintf(log, "bench: reshard %d -> %d: switch after %v (bound %v), %d events sent to both plans, %d copies recognised, RSS %d -> peak %d KiB, %d identifies\n",
		n, next, r.toSwitch.Round(time.Millisecond), r.bound, r.both, r.dropped, r.rssBefore>>10, r.rssPeak>>10, r.identifies)
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
		r, err := reshardRun(bin, n, rc.concurrency, rc.rate, log)
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
			measure: fmt.Sprintf("events sent to both plans during the move, %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.both)}},
			ratio:   fmt.Sprintf("%d recognised as copies", r.dropped),
			target:  "every copy recognised (the rest were still within the 30 s window when read)",
			met:     boolp(r.dropped <= r.both && r.dropped > 0),
		})
		sec.add(row{
			measure: fmt.Sprintf("extra resident memory while both plans run, %d -> %d", n, next), unit: "KiB",
			values: map[string][]float64{colReshard: {float64((r.rssPeak - r.rssBefore) >> 10)}},
			ratio:  fmt.Sprintf("%.1f KiB per new shard", float64((r.rssPeak-r.rssBefore)>>10)/float64(next)),
		})
		sec.add(row{
			measure: fmt.Sprintf("identifies for the move, %d -> %d", n, next),
			values:  map[string][]float64{colReshard: {float64(r.identifies)}},
			target:  "one per new shard", met: boolp(r.identifies == int64(next)),
		})
	}
	sec.method = []string{
		"Each size starts a fresh simulator (Discord flavour, the real identify rule at max_concurrency " + strconv.Itoa(rc.concurrency) + ", four guilds on every shard of the larger plan) " +
			"and the real binary, `shardfs serve --flavor discord --total auto`, built from this tree. Once every shard is READY, the simulator publishes " + strconv.Itoa(rc.rate) + " MESSAGE_CREATEs a second over the guilds, " +
			"each to every session its guild routes to (both plans during the move, as Discord does), then discovery is made to recommend twice the shards (serve rounds it up to a multiple of max_concurrency) and shard 0 is closed with 4011. " +
			"The time runs from that close to the moment serve's /reshard says switched (polled every 100 ms over 9P); the memory is serve's VmRSS before the 4011 and its peak while polling. " +
			"Events sent to both plans are the simulator's count; the copies recognised are /reshard's copies_dropped at the switch (copies still held or in flight then are matched later, within the 30 s window).",
	}
	return sec, nil
}
