package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
	"github.com/shardfs/shardfs/node"
)

// runNode is the "shardfs-node" role: a shardfs node as the binary's serve
// command assembles it (node: gateway transport, core, tree, 9P
// server), against a simulator's API, with no compression. It builds
// nothing until "start", so that its memory can be read before any shard
// exists.
func runNode(args []string) error {
	fs := flag.NewFlagSet("shardfs-node", flag.ContinueOnError)
	api := fs.String("api", "", "the simulator's API URL")
	shards := fs.Int("shards", 1, "local shards 0..N-1")
	total := fs.Int("total", 0, "the bot's shard count (default: shards)")
	alias := fs.Bool("alias", false, "also serve /ctl/null = 0/state on a second listener, for diodload")
	latency := fs.Bool("latency", false, "record the core's event-handling times (for lat)")
	compression := fs.String("compression", "none", "transport compression: none, zlib-stream or zstd-stream")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the node's life here")
	memProfile := fs.String("memprofile", "", "write an allocation profile here at exit")
	memRate := fs.Int("memprofilerate", 0, "runtime.MemProfileRate (0 keeps the default), for the heap command")
	withRelay := fs.Bool("relay", false, "also serve the gateway relay on a loopback port (its address: relay-addr)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *total <= 0 {
		*total = *shards
	}
	comp, err := gateway.ParseCompression(*compression)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 4096
		defer func() {
			if f, err := os.Create(*memProfile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	if *memRate > 0 {
		runtime.MemProfileRate = *memRate
	}
	n := &nodeRole{api: *api, shards: *shards, total: *total, alias: *alias, latency: *latency, compression: comp, relay: *withRelay}
	defer n.close()
	serveCommands("", map[string]func([]string) (string, error){
		"start":      n.start,
		"ready":      n.ready,
		"wait-ready": n.waitReady,
		"count":      n.count,
		"gc":         collect,
		"lat":        n.lat,
		"lat-reset":  n.latReset,
		"heap":       heapProfile,
		"memstats":   memClasses,
		"heapsum":    heapBreakdown,
		"retries":    n.retries,
		"relay-addr": func([]string) (string, error) { return n.relayAddr, nil },
	})
	return nil
}

type nodeRole struct {
	api          string
	shards       int
	total        int
	alias        bool
	latency      bool
	compression  gateway.Compression
	relay        bool
	relayAddr    string // the relay's listener, after start
	sup          *node.Node
	addr, alAddr string
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	events       hist
	latByKind    sync.Map // kind → *hist
}

// start: builds the node, starts its shards and serves 9P on a loopback
// TCP port; answers with that address (and the alias listener's).
// Over TLS the node checks the simulator's certificate against the system
// roots, as the binary does: SSL_CERT_FILE and SSL_CERT_DIR (see trust)
// make them the harness's CA.
func (n *nodeRole) start([]string) (string, error) {
	if n.sup != nil {
		return "", errors.New("already started")
	}
	cfg := node.Config{
		Flavor:      core.Discord,
		Token:       os.Getenv(tokenEnv),
		API:         n.api,
		Plan:        core.Range(n.total, 0, n.shards-1),
		Intents:     gatewaysim.IntentGuilds | gatewaysim.IntentGuildMessages,
		Compression: n.compression,
		// The binary's default: 1% of the session starts kept back.
		IdentifyReserve: gateway.DefaultReserve,
	}
	if n.latency {
		cfg.ObserveEvent = n.observe
	}
	if n.relay {
		// Room for a relay client that reads slower than the traffic of a
		// phase (5 s of 10,000 events/s of 700 bytes is 35 MB): below
		// the retention it is closed 4009, as designed, and the phase
		// would measure its reconnects.
		cfg.Relay, cfg.DispatchRetention = true, 128<<20
	}
	sup, err := node.New(cfg)
	if err != nil {
		return "", err
	}
	n.sup = sup
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	n.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Go(func() { _ = sup.Serve(ctx, ln) })
	if n.alias {
		al, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		n.alAddr = al.Addr().String()
		srv, err := aliasServer(sup)
		if err != nil {
			return "", err
		}
		n.wg.Go(func() { _ = srv.Serve(ctx, al) })
		context.AfterFunc(ctx, func() { srv.Close() })
	}
	if sup.Relay != nil {
		rl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		n.relayAddr = rl.Addr().String()
		n.wg.Go(func() { _ = sup.Relay.Serve(rl) })
	}
	sup.Start()
	return n.addr + " " + n.alAddr, nil
}

// aliasServer serves, with fsrv and the node's own file, the tree diodload
// expects: it attaches to aname "ctl" and walks to "null" (diod's synthetic
// control file system). Here ctl/null is a text file whose content is
// computed by the node's own 0/state callback.
func aliasServer(sup *node.Node) (*fsrv.Server, error) {
	dir, ok := sup.Tree.Root().Lookup("0").(*fsrv.Dir)
	if !ok {
		return nil, errors.New("no shard 0")
	}
	var null *fsrv.Text
	for _, e := range dir.List() {
		if t, ok := e.(*fsrv.Text); ok && t.Name == "state" {
			null = &fsrv.Text{Name: "null", Content: t.Content}
		}
	}
	if null == nil {
		return nil, errors.New("no 0/state")
	}
	ctl := &fsrv.Dir{Name: "ctl", List: func() []fsrv.File { return []fsrv.File{null} }}
	root := &fsrv.Dir{Name: "/", List: func() []fsrv.File { return []fsrv.File{ctl} }}
	return &fsrv.Server{Root: root}, nil
}

// observe records one event-handling time, in all and by kind.
func (n *nodeRole) observe(kind string, d time.Duration) {
	n.events.record(d)
	h, ok := n.latByKind.Load(kind)
	if !ok {
		h, _ = n.latByKind.LoadOrStore(kind, new(hist))
	}
	h.(*hist).record(d)
}

// readyCount counts READY shards. Waits call it over and over, so it
// looks at one shard at a time rather than charge the node's memory with
// a snapshot of all of them.
func (n *nodeRole) readyCount() int {
	if n.sup == nil {
		return 0
	}
	c := 0
	for _, id := range n.sup.Scheduler.Plan().Local {
		if d, err := n.sup.Scheduler.Diag(id); err == nil && d.State == core.Ready {
			c++
		}
	}
	return c
}

// ready: how many shards are READY.
func (n *nodeRole) ready([]string) (string, error) { return strconv.Itoa(n.readyCount()), nil }

// wait-ready N TIMEOUT: waits until N shards are READY.
func (n *nodeRole) waitReady(args []string) (string, error) {
	want, err1 := argInt(args, 0)
	timeout, err2 := argDuration(args, 1)
	if err1 != nil || err2 != nil {
		return "", errors.New("usage: wait-ready N TIMEOUT")
	}
	return waitFor(timeout, want, n.readyCount)
}

// waitFor polls count until it reaches want.
func waitFor(timeout time.Duration, want int, count func() int) (string, error) {
	var got int
	err := poll.Until(context.Background(), fmt.Sprintf("%d ready", want), timeout, 20*time.Millisecond, func() error {
		if got = count(); got < want {
			return fmt.Errorf("%d of %d", got, want)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return strconv.Itoa(got), nil
}

// count: dispatches written to the dispatch logs.
func (n *nodeRole) count([]string) (string, error) {
	if n.sup == nil {
		return "0", nil
	}
	return strconv.FormatUint(n.sup.Tree.DispatchCount(), 10), nil
}

// lat: the core's event-handling time since lat-reset: count p50 p99 max in
// nanoseconds, then the same per kind as kind=count/p50/p99.
func (n *nodeRole) lat([]string) (string, error) {
	out := fmt.Sprintf("%d %.0f %.0f %d", n.events.n.Load(), n.events.quantile(0.50), n.events.quantile(0.99), n.events.max.Load())
	n.latByKind.Range(func(k, v any) bool {
		h := v.(*hist)
		out += fmt.Sprintf(" %s=%d/%.0f/%.0f", k, h.n.Load(), h.quantile(0.5), h.quantile(0.99))
		return true
	})
	return out, nil
}

func (n *nodeRole) latReset([]string) (string, error) {
	n.events.reset()
	n.latByKind.Range(func(_, v any) bool {
		v.(*hist).reset()
		return true
	})
	return "", nil
}

func (n *nodeRole) close() {
	if n.sup == nil {
		return
	}
	n.cancel()
	_ = n.sup.Close()
	n.wg.Wait()
}

// collect settles a Go process's memory the same way on every side before
// its resident size is read: a few collections (so that idle goroutines'
// stacks shrink, as they do over a shard's idle life) and a return of free
// pages to the OS. It answers with the goroutine count.
func collect([]string) (string, error) {
	for range 3 {
		runtime.GC()
	}
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return fmt.Sprintf("%d %d %d", runtime.NumGoroutine(), m.HeapInuse, m.StackInuse), nil
}

// heap PATH: writes a heap profile (in-use and allocated) after a
// collection.
func heapProfile(args []string) (string, error) {
	if len(args) != 1 {
		return "", errors.New("usage: heap PATH")
	}
	runtime.GC()
	f, err := os.Create(args[0])
	if err != nil {
		return "", err
	}
	defer f.Close()
	return "", pprof.Lookup("heap").WriteTo(f, 0)
}

// memstats: the runtime's memory classes, for looking into a resident size.
func memClasses([]string) (string, error) {
	var samples []metrics.Sample
	for _, d := range metrics.All() {
		if strings.HasPrefix(d.Name, "/memory/classes/") {
			samples = append(samples, metrics.Sample{Name: d.Name})
		}
	}
	metrics.Read(samples)
	var b strings.Builder
	for _, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			fmt.Fprintf(&b, "%s=%d ", strings.TrimPrefix(s.Name, "/memory/classes/"), s.Value.Uint64())
		}
	}
	return b.String(), nil
}

// retries: the reconnect delays (retry_ms) of the backoff lines in the
// node's events log: how many, their median and their largest.
func (n *nodeRole) retries([]string) (string, error) {
	if n.sup == nil {
		return "0 0 0", nil
	}
	l := n.sup.Scheduler.Events()
	buf := make([]byte, l.Size()-l.Oldest())
	k, _ := l.ReadAt(buf, l.Oldest())
	var delays []float64
	for _, line := range strings.Split(string(buf[:k]), "\n") {
		if !strings.Contains(line, " event=backoff ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "retry_ms="); ok {
				if ms, err := strconv.ParseFloat(v, 64); err == nil {
					delays = append(delays, ms)
				}
			}
		}
	}
	if len(delays) == 0 {
		return "0 0 0", nil
	}
	slices.Sort(delays)
	return fmt.Sprintf("%d %.0f %.0f", len(delays), delays[len(delays)/2], delays[len(delays)-1]), nil
}
