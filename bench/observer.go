package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// observers are 9P clients in the harness process: some read status the
// way watch-states.sh does, others follow events the way tail -f does.
// They run only while active is set.
type observers struct {
	active  atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
	reads   atomic.Int64 // status reads done
	follows atomic.Int64 // events polls done
	bytes   atomic.Int64
	errMu   sync.Mutex
	err     error
	clients []*p9.Client
}

func startObservers(addr string, status, events int, interval time.Duration) (*observers, error) {
	o := &observers{stop: make(chan struct{})}
	attach := func() (p9.File, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		cl, err := p9.NewClient(c, p9.WithMessageSize(64<<10))
		if err != nil {
			c.Close()
			return nil, err
		}
		o.clients = append(o.clients, cl)
		return cl.Attach("")
	}
	for range status {
		root, err := attach()
		if err != nil {
			o.close()
			return nil, err
		}
		o.wg.Go(func() {
			o.loop(interval, func() error {
				b, err := readFile(root, "status")
				if err == nil && !strings.HasSuffix(string(b), "\n") {
					err = fmt.Errorf("status of %d bytes without a final newline", len(b))
				}
				o.reads.Add(1)
				o.bytes.Add(int64(len(b)))
				return err
			})
		})
	}
	for range events {
		root, err := attach()
		if err != nil {
			o.close()
			return nil, err
		}
		_, f, err := root.Walk([]string{"events"})
		if err == nil {
			_, _, err = f.Open(p9.ReadOnly)
		}
		if err != nil {
			o.close()
			return nil, err
		}
		_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
		if err != nil {
			o.close()
			return nil, err
		}
		off := int64(attr.Size)
		o.wg.Go(func() {
			buf := make([]byte, 64<<10)
			o.loop(interval, func() error {
				// tail -f: look at the size, read what is new.
				_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
				if err != nil {
					return err
				}
				for off < int64(attr.Size) {
					n, err := f.ReadAt(buf, off)
					if err != nil && err != io.EOF {
						return err
					}
					if n == 0 {
						break
					}
					off += int64(n)
					o.bytes.Add(int64(n))
				}
				o.follows.Add(1)
				return nil
			})
		})
	}
	return o, nil
}

// loop runs poll every interval, starting at a random point of the first
// interval so that the clients do not poll in step.
func (o *observers) loop(interval time.Duration, poll func() error) {
	t := time.NewTimer(rand.N(interval))
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
		}
		t.Reset(interval)
		if !o.active.Load() {
			continue
		}
		if err := poll(); err != nil {
			o.errMu.Lock()
			if o.err == nil {
				o.err = err
			}
			o.errMu.Unlock()
			return
		}
	}
}

func (o *observers) close() error {
	close(o.stop)
	o.wg.Wait()
	for _, c := range o.clients {
		c.Close()
	}
	o.errMu.Lock()
	defer o.errMu.Unlock()
	return o.err
}

type latency struct {
	n        int64
	p50, p99 float64 // nanoseconds
	max      float64
	detail   string
}

func (c *client) latency() (latency, error) {
	out, err := c.call(time.Minute, "lat")
	if err != nil {
		return latency{}, err
	}
	f := strings.Fields(out)
	if len(f) < 4 {
		return latency{}, fmt.Errorf("lat: %q", out)
	}
	var l latency
	l.n, _ = strconv.ParseInt(f[0], 10, 64)
	l.p50, _ = strconv.ParseFloat(f[1], 64)
	l.p99, _ = strconv.ParseFloat(f[2], 64)
	l.max, _ = strconv.ParseFloat(f[3], 64)
	l.detail = strings.Join(f[4:], " ")
	return l, nil
}

func runObserver(cfg config, log io.Writer) (*section, error) {
	const without, with = "without observers", "with observers"
	sec := &section{columns: []string{without, with}}
	p50 := map[string][]float64{}
	p99 := map[string][]float64{}
	count := map[string][]float64{}
	var details []string
	var statusReads, follows int64
	for i := range cfg.runs {
		for _, phase := range []string{without, with} {
			// A fresh node for every phase: the shards' backoff grows
			// while they keep failing, so a phase that followed another
			// would see a different mix of events.
			if err := observerPhase(cfg, log, i, phase, phase == with, p50, p99, count, &details, &statusReads, &follows); err != nil {
				return sec, fmt.Errorf("run %d, %s: %w", i+1, phase, err)
			}
		}
	}
	if statusReads == 0 || follows == 0 {
		return sec, errors.New("the observers did not poll")
	}
	growth := median(p99[with]) / median(p99[without])
	sec.add(row{measure: "event-handling latency p50", unit: "µs", values: p50, digits: 1,
		ratio: fmt.Sprintf("%.2f×", median(p50[with])/median(p50[without]))})
	sec.add(row{measure: "event-handling latency p99", unit: "µs", values: p99, digits: 1,
		ratio: fmt.Sprintf("%.2f× (%+.0f%%)", growth, (growth-1)*100), target: "p99 grows < 10%", met: boolp(growth < 1.10)})
	sec.add(row{measure: "lifecycle events handled per phase", values: count})
	sec.method = []string{
		fmt.Sprintf("A phase is %[2]v with a shardfs node of %[1]d READY shards, either without observers or with %[3]d clients reading `status` and %d following `events` over 9P "+
			"(the hugelgupf/p9 client in the harness process, one connection each, over the node's TCP listener), each polling every %v as watch-states.sh and tail -f do: "+
			"a status reader walks, opens, reads to the end and clunks; an events follower keeps the file open, asks its size and reads what is new. "+
			"Every phase runs on a fresh simulator and node (the shards' backoff grows while they keep failing, so a phase that followed another would see other events), and the phases alternate: without, with, without, ..., %d of each. "+
			"In every phase the simulator injects %d resumable faults per second into random shards (a dropped connection, a close 4000 or an op 7), "+
			"and the node times every lifecycle event its core handles (core.Config.ObserveEvent: failures, READY, RESUMED, reconnect and identify-slot timers, never dispatches; from the event's arrival, waiting for the shard's lock included, to the end of its handling; also exported as shardfs_core_event_seconds in /metrics).",
			cfg.observerShards, cfg.observerPhase, cfg.observerStatus, cfg.observerEvents, cfg.observerInterval, cfg.runs, cfg.observerFlapRate),
		fmt.Sprintf("The observers made %d status reads and %d events polls during the observed phases. Percentiles come from a log-linear histogram in the node (32 sub-buckets per power of two, within about 2%%). "+
			"Handling an event often wakes another thread (a reconnect starts a goroutine, a close wakes a reader); on a virtual machine that is quicker when the other CPU is busy than when it sleeps, so the observers' load can lower the latency: the target only asks that it not grow.", statusReads, follows),
	}
	sec.extra = append(sec.extra, "Per phase:\n\n- "+strings.Join(details, "\n- "))
	return sec, nil
}

// observerPhase runs one phase on a fresh simulator and node, with or
// without observers, and records its latencies.
func observerPhase(cfg config, log io.Writer, run int, phase string, withObservers bool, p50, p99, count map[string][]float64, details *[]string, statusReads, follows *int64) error {
	n := cfg.observerShards
	s, err := startSim(n, "-max-concurrency", strconv.Itoa(n))
	if err != nil {
		return err
	}
	defer s.close()
	c, err := startClient(sideShardfs, s, n, n, "-latency")
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.begin(5 * time.Minute); err != nil {
		return err
	}
	if err := c.waitReady(n, 5*time.Minute); err != nil {
		return err
	}
	var obs *observers
	if withObservers {
		if obs, err = startObservers(c.addr, cfg.observerStatus, cfg.observerEvents, cfg.observerInterval); err != nil {
			return err
		}
		obs.active.Store(true)
	}
	if _, err := c.call(time.Minute, "lat-reset"); err != nil {
		return err
	}
	if _, err := s.call(time.Minute, "flap %d %d", n, cfg.observerFlapRate); err != nil {
		return err
	}
	time.Sleep(cfg.observerPhase)
	injected, err := s.callInts(time.Minute, "flap 0 0")
	if err != nil {
		return err
	}
	l, err := c.latency()
	if err != nil {
		return err
	}
	if obs != nil {
		obs.active.Store(false)
		*statusReads += obs.reads.Load()
		*follows += obs.follows.Load()
		if err := obs.close(); err != nil {
			return fmt.Errorf("observer: %w", err)
		}
	}
	p50[phase] = append(p50[phase], l.p50/1000)
	p99[phase] = append(p99[phase], l.p99/1000)
	count[phase] = append(count[phase], float64(l.n))
	*details = append(*details, fmt.Sprintf("run %d %s: %d faults, %d events, p50 %.1f µs, p99 %.1f µs, max %.1f µs; by kind (count/p50/p99 ns): %s",
		run+1, phase, injected[0], l.n, l.p50/1000, l.p99/1000, l.max/1000, l.detail))
	fmt.Fprintf(log, "bench: observer %s\n", (*details)[len(*details)-1])
	return nil
}
