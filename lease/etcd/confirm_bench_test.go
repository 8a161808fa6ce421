package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// BenchmarkConfirmedDelivery measures what confirmed delivery adds to an
// event against a real etcd (in this process, on loopback): 16 shards
// read events at a total rate, each event waits for core.Confirmations
// over Member.Confirm, as a gateway reader does. It reports the added
// latency per event (p50, p99) and the etcd reads per second, which the
// round trip bounds whatever the event rate. "get" is one plain Get, the
// round trip itself.
func BenchmarkConfirmedDelivery(b *testing.B) {
	srv := etcdtest.Start(b)
	cli := srv.Client()
	m, err := Join(etcdtest.Ctx(b, 10*time.Second), Config{Client: cli, Bot: "b", Node: "a", Plan: plan16, TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.Run("get", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			t0 := time.Now()
			if _, err := cli.Get(context.Background(), "/shardfs/b/members/a"); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		reportLatency(b, lat)
	})
	const shards = 16
	for _, rate := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("events=%d/s", rate), func(b *testing.B) {
			conf := core.NewConfirmations(m.Confirm, nil, 0)
			defer conf.Close()
			var mu sync.Mutex
			lat := make([]time.Duration, 0, b.N)
			gap := time.Duration(shards) * time.Second / time.Duration(rate)
			per := (b.N + shards - 1) / shards
			b.ResetTimer()
			t0 := time.Now()
			var wg sync.WaitGroup
			for s := range shards {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each shard reads its events one at a time, as a
					// reader does: the next is read once the last is
					// delivered, or when it is due.
					next := t0.Add(gap * time.Duration(s) / shards)
					for range per {
						if d := time.Until(next); d > 0 {
							time.Sleep(d)
						}
						next = next.Add(gap)
						r := time.Now()
						if err := conf.Confirm(context.Background()); err != nil {
							b.Error(err)
							return
						}
						d := time.Since(r)
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(t0)
			b.StopTimer()
			reportLatency(b, lat)
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(conf.Checks())/elapsed.Seconds(), "etcd-reads/s")
		})
	}
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
