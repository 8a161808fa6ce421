package dir

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

const benchShards = 1024

// BenchmarkSave is what a clean stop of 1,024 shards costs: one op saves
// every shard, one after another; fsync dominates.
func BenchmarkSave(b *testing.B) {
	s := open(b, b.TempDir(), nil)
	ctx := context.Background()
	for b.Loop() {
		for n := range benchShards {
			if err := s.Save(ctx, n, snap(int64(n))); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchShards), "ns/shard")
}

// BenchmarkSaveConcurrent saves the 1,024 shards from several goroutines,
// as a core stopping its shards concurrently would: the file system
// commits their fsyncs together.
func BenchmarkSaveConcurrent(b *testing.B) {
	for _, workers := range []int{16, 64} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			s := open(b, b.TempDir(), nil)
			ctx := context.Background()
			for b.Loop() {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for n := w; n < benchShards; n += workers {
							if err := s.Save(ctx, n, snap(int64(n))); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchShards), "ns/shard")
		})
	}
}

// BenchmarkLoad is what a restart of 1,024 shards reads: one op loads every
// shard (from the page cache; a cold one after a reboot costs more).
func BenchmarkLoad(b *testing.B) {
	s := open(b, b.TempDir(), nil)
	ctx := context.Background()
	for n := range benchShards {
		if err := s.Save(ctx, n, snap(int64(n))); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		for n := range benchShards {
			if _, ok, err := s.Load(ctx, n); !ok || err != nil {
				b.Fatalf("Load(%d) = %v, %v", n, ok, err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchShards), "ns/shard")
}
