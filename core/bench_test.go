package core_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// benchNode returns a node running local shards [0, local) of total, all
// READY with their leases armed, so that every shard has a pending timer.
func benchNode(b *testing.B, total, local int) *env {
	e := newEnv(b, core.Config{Plan: core.Range(total, 0, local-1)}, maxConcurrency(local))
	e.startAll()
	e.exec(-1, "lease 1h")
	return e
}

var scales = []struct{ total, local int }{{16384, 16384}, {16384, 64}, {64, 64}}

// The cost of one transport event must not depend on the global total or
// on the number of local shards.
func BenchmarkTransportEvent(b *testing.B) {
	for _, sc := range scales {
		b.Run(fmt.Sprintf("total=%d/local=%d", sc.total, sc.local), func(b *testing.B) {
			e := benchNode(b, sc.total, sc.local)
			links := make([]*core.Link, sc.local)
			for i := range links {
				links[i] = e.conn(i).Link
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				links[i%sc.local].Dispatch(int64(i + 2))
				i++
			}
		})
	}
}

// One timer event: a shard fails, its backoff deadline fires, it resets and
// reconnects by resume. Every shard keeps an armed lease (a pending timer
// each), renewed outside the measurement before it can expire.
func BenchmarkTimerEvent(b *testing.B) {
	for _, sc := range scales {
		b.Run(fmt.Sprintf("total=%d/local=%d", sc.total, sc.local), func(b *testing.B) {
			e := benchNode(b, sc.total, sc.local)
			fail := core.Failure{Class: core.Transient, Err: errDrop}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%500 == 499 {
					b.StopTimer()
					e.exec(-1, "lease 1h")
					b.StartTimer()
				}
				id := i % sc.local
				e.conn(id).Link.Fail(fail)
				e.clk.Advance(5 * time.Second) // fires exactly this shard's deadline
				e.conn(id).Link.Resumed(int64(i + 2))
				i++
			}
			b.StopTimer()
			if d := e.diag(0); d.State != core.Ready || d.Reconnects == 0 {
				b.Fatalf("shard 0 ended %v after %d reconnects; the benchmark measured nothing", d.State, d.Reconnects)
			}
		})
	}
}

// The bytes one shard context costs, event logs included, once READY. Each
// iteration builds a node of 4,096 shards: run it with the default
// -benchtime.
func BenchmarkShardContextBytes(b *testing.B) {
	const n = 4096
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		e := newEnv(b, core.Config{Plan: core.Range(n, 0, n-1)}, maxConcurrency(n))
		e.startAll()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/shard")
		runtime.KeepAlive(e)
	}
}

// A diagnostics snapshot of every shard while they run.
func BenchmarkSnapshot(b *testing.B) {
	for _, local := range []int{64, 16384} {
		b.Run(fmt.Sprintf("local=%d", local), func(b *testing.B) {
			e := benchNode(b, 16384, local)
			dst := make([]core.Diag, 0, local)
			b.ReportAllocs()
			for b.Loop() {
				dst = e.node.Snapshot(dst[:0])
			}
		})
	}
}

// Cancelling every request of 16,384 shards waiting for an identify slot,
// as "stop all" or "reset all" does, in shard order and in reverse: the
// pacer's lock is held for each cancel, so its cost decides how long every
// other shard waits for a slot.
func BenchmarkCancelAll16384(b *testing.B) {
	const n = 16384
	for _, mc := range []int{1, 16} {
		for _, order := range []string{"forward", "reverse"} {
			b.Run(fmt.Sprintf("max_concurrency=%d/%s", mc, order), func(b *testing.B) {
				clk := clock.NewFake()
				p := core.NewDiscordPacer(clk, mc)
				cancels := make([]func(), n)
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					for i := range cancels {
						_, cancels[i] = p.Request(i, false, func() { b.Fatal("granted while the clock stands still") })
					}
					if order == "reverse" {
						slices.Reverse(cancels)
					}
					b.StartTimer()
					for _, cancel := range cancels {
						cancel()
					}
					b.StopTimer()
					clk.Advance(core.DiscordWindow) // every bucket free again
					if w, _ := p.Waiting(); w != 0 {
						b.Fatalf("%d requests still waiting after cancelling all", w)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// "stop all" on a node of 16,384 shards that all wait for an identify slot.
func BenchmarkStopAllWaiting16384(b *testing.B) {
	const n = 16384
	for _, mc := range []int{1, 16} {
		b.Run(fmt.Sprintf("max_concurrency=%d", mc), func(b *testing.B) {
			e := newEnv(b, core.Config{Plan: core.Range(n, 0, n-1)}, maxConcurrency(mc))
			e.node.Start()
			b.ReportAllocs()
			for b.Loop() {
				e.exec(-1, "stop all")
				b.StopTimer()
				e.clk.Advance(core.DiscordWindow)
				e.exec(-1, "start all")
				b.StartTimer()
			}
		})
	}
}
