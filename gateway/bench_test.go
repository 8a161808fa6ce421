package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/journal"
)

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// waitLines waits until l holds n lines containing substr.
func waitLines(tb testing.TB, l *journal.Log, substr string, n int, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		ch := l.Notify()
		if strings.Count(logText(l, l.Oldest()), substr) >= n {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("%d lines with %q; want %d", strings.Count(logText(l, l.Oldest()), substr), substr, n)
		}
	}
}

// BenchmarkDispatch floods one shard with ~700-byte MESSAGE_CREATE events
// from a simulator in another process and measures them end to end
// (gateway → transport → sink and core): events per second, process CPU
// per event, and allocations per event.
func BenchmarkDispatch(b *testing.B) {
	for _, v := range []struct {
		name     string
		flavor   core.Flavor
		compress Compression
	}{
		{"json", core.Discord, NoCompression},
		{"zlib-stream", core.Discord, ZlibStream},
		{"zstd-stream", core.Discord, ZstdStream},
		{"fluxer-zstd-stream", core.Fluxer, ZstdStream},
	} {
		b.Run(v.name, func(b *testing.B) {
			child := startChildSim(b, v.flavor, 1)
			defer child.close()
			var count, target atomic.Int64
			target.Store(-1)
			done := make(chan struct{}, 1)
			tr, err := New(Config{Flavor: v.flavor, Token: testToken, API: child.api, Compression: v.compress, Intents: 1 << 9,
				Sink: func(_ int, _ string, _ int64, _ string, d []byte) {
					if count.Add(1) == target.Load() {
						done <- struct{}{}
					}
				}})
			if err != nil {
				b.Fatal(err)
			}
			node, err := core.New(core.Config{Plan: core.Range(1, 0, 0), Flavor: v.flavor, Transport: tr})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			defer node.Close()
			node.Start()
			waitLines(b, node.Events(), "event=ready", 1, wait)

			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, t0 := cpuTime(), time.Now()
			target.Store(count.Load() + int64(b.N))
			child.flood(b, 0, b.N)
			select {
			case <-done:
			case <-time.After(time.Minute):
				b.Fatalf("sink saw %d of %d events", count.Load(), target.Load())
			}
			cpu, elapsed := cpuTime()-cpu0, time.Since(t0)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
		})
	}
}

// BenchmarkIdleShards brings N idle shards (default 1024, or
// SHARDFS_IDLE_SHARDS; compression from SHARDFS_IDLE_COMPRESS; wss:// with
// SHARDFS_IDLE_TLS=1, as against the real gateways) to READY against a simulator in another process and
// reports what each costs the process: live heap, goroutine stacks and
// resident memory, core included, and goroutines. It measures once,
// whatever b.N; run it with -benchtime=1x.
func BenchmarkIdleShards(b *testing.B) {
	n := 1024
	if os.Getenv("SHARDFS_IDLE_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	if s, err := strconv.Atoi(os.Getenv("SHARDFS_IDLE_SHARDS")); err == nil && s > 0 {
		n = s
	}
	wss := os.Getenv("SHARDFS_IDLE_TLS") == "1"
	child := startChildSimTLS(b, core.Discord, n, wss)
	defer child.close()
	pacer := core.NewDiscordPacer(nil, 1)
	compress, err := ParseCompression(os.Getenv("SHARDFS_IDLE_COMPRESS"))
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Flavor: core.Discord, Token: testToken, API: child.api, Intents: 1, OnStartLimit: pacer.SetStartLimit, Compression: compress}
	if wss {
		// No discovery: its URL is the plain one. Every bucket at once,
		// as discovery would have said.
		cfg.GatewayURL, cfg.TLSConfig = child.wss, &tls.Config{RootCAs: child.roots}
		pacer = core.NewDiscordPacer(nil, n)
		cfg.OnStartLimit = nil
	}
	tr, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	if !wss {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if _, err := tr.Discover(ctx); err != nil {
			b.Fatal(err)
		}
	}
	before := measure()
	node, err := core.New(core.Config{Plan: core.Range(n, 0, n-1), Transport: tr, Pacer: pacer})
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	start := time.Now()
	node.Start()
	waitLines(b, node.Events(), "event=ready", n, 2*time.Minute)
	b.Logf("%d shards READY in %v", n, time.Since(start).Round(time.Millisecond))
	after := measure()
	if path := os.Getenv("SHARDFS_IDLE_HEAP_PROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
	per := func(a, b uint64) float64 { return float64(int64(a)-int64(b)) / float64(n) }
	b.ReportMetric(per(after.heap, before.heap), "heap-B/shard")
	b.ReportMetric(per(after.stack, before.stack), "stack-B/shard")
	b.ReportMetric(per(after.heap+after.stack, before.heap+before.stack), "B/shard")
	b.ReportMetric(per(after.rss, before.rss), "rss-B/shard")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/shard")
}

type usage struct {
	heap, stack, rss uint64
	goroutines       int
}

// measure settles the heap and the stacks (a few collections let idle
// goroutines' stacks shrink, as they do over a shard's idle life) and
// reads them.
func measure() usage {
	for range 5 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	u := usage{heap: m.HeapInuse, stack: m.StackInuse, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				u.rss = kb << 10
			}
		}
	}
	return u
}

// BenchmarkDecode measures the client's work per event without the
// network: decompression (one stream), envelope decoding and the event
// name, for the same ~700-byte MESSAGE_CREATE the simulator floods.
func BenchmarkDecode(b *testing.B) {
	const n = 4096
	payloads := make([][]byte, n)
	for i := range payloads {
		d := `{"id":"` + strconv.Itoa(1_000_000_000+i) + `","channel_id":"1258291200000000001","guild_id":"1258291200000000000","author":{"id":"1258287006515200000","username":"user42","discriminator":"0","global_name":null,"avatar":null,"bot":false},"timestamp":"2026-11-30T07:00:00.000000+00:00","edited_timestamp":null,"tts":false,"mention_everyone":false,"mentions":[],"mention_roles":[],"attachments":[],"embeds":[],"pinned":false,"type":0,"content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 6) + `"}`
		payloads[i] = []byte(`{"op":0,"s":` + strconv.Itoa(i+1) + `,"t":"MESSAGE_CREATE","d":` + d + `}`)
	}
	var names internTable
	names.init()
	handle := func(p []byte) {
		pl, err := parsePayload(p)
		if err != nil || names.get(pl.name) != "MESSAGE_CREATE" {
			b.Fatalf("parsePayload: %v", err)
		}
	}
	b.Run("json", func(b *testing.B) {
		b.SetBytes(int64(len(payloads[0])))
		b.ReportAllocs()
		for i := range b.N {
			handle(payloads[i%n])
		}
	})
	for _, c := range []Compression{ZlibStream, ZstdStream} {
		msgs := compressMessages(b, c, payloads)
		b.Run(string(c), func(b *testing.B) {
			b.SetBytes(int64(len(payloads[0])))
			b.ReportAllocs()
			for done := 0; done < b.N; {
				b.StopTimer()
				rest := msgs[1:]
				src := func() (io.Reader, bool, error) {
					if len(rest) == 0 {
						return nil, false, io.EOF
					}
					r := bytes.NewReader(rest[0])
					rest = rest[1:]
					return r, true, nil
				}
				z, err := newInflater(c, bytes.NewReader(msgs[0]), src)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for i := 0; i < n && done < b.N; i++ {
					p, buf, err := z.next()
					if err != nil {
						b.Fatal(err)
					}
					handle(p)
					putBuf(buf)
					done++
				}
				z.close()
			}
		})
	}
}
