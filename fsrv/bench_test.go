package fsrv

import (
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"9fans.net/go/plan9"
	"github.com/hugelgupf/p9/p9"
)

// Benchmarks with the hugelgupf/p9 client over loopback TCP. One op of
// BenchmarkCat is what `cat status` costs: walk, open, read, clunk.
// FACTS.md has anchors: hugelgupf client to hugelgupf server, GetAttr
// 22.5k/s, walk+open+read+clunk 4.8k/s on one connection.

func benchConns(b *testing.B, n int) []p9.File {
	fx := newFixture()
	srv := &Server{Root: fx.root, Clock: fx.clock}
	addr := listen(b, srv)
	roots := make([]p9.File, n)
	for i := range roots {
		_, roots[i] = dialDotL(b, addr)
	}
	return roots
}

// parallel runs op on conns connections at once, b.N times in all; one
// connection means one request at a time.
func parallel(b *testing.B, conns int, op func(root p9.File) error) {
	roots := benchConns(b, conns)
	if conns == 1 {
		for b.Loop() {
			if err := op(roots[0]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		return
	}
	var next atomic.Int64
	b.SetParallelism((conns + 1) / 2) // GOMAXPROCS is 2 here: 2*8 = 16
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		root := roots[int(next.Add(1)-1)%len(roots)]
		for pb.Next() {
			if err := op(root); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func catDotL(root p9.File) error {
	_, f, err := root.Walk([]string{"status"})
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return err
	}
	var buf [512]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		return err
	}
	if string(buf[:n]) != "READY\n" {
		return fmt.Errorf("read %q", buf[:n])
	}
	return nil
}

func BenchmarkCat(b *testing.B) {
	for _, conns := range []int{1, 16} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) { parallel(b, conns, catDotL) })
	}
}

func BenchmarkGetAttr(b *testing.B) {
	for _, conns := range []int{1, 16} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			parallel(b, conns, func(root p9.File) error {
				_, _, _, err := root.GetAttr(p9.AttrMaskAll)
				return err
			})
		})
	}
}

// BenchmarkCat9P2000 is BenchmarkCat with the 9fans client, for comparison.
func BenchmarkCat9P2000(b *testing.B) {
	fx := newFixture()
	addr := listen(b, &Server{Root: fx.root, Clock: fx.clock})
	fsys := dial9(b, addr)
	b.ResetTimer()
	for b.Loop() {
		fid, err := fsys.Open("status", plan9.OREAD)
		if err != nil {
			b.Fatal(err)
		}
		var buf [512]byte
		fid.Read(buf[:])
		fid.Close()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
