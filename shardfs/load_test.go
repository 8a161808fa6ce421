package shardfs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/core"
)

// 1,000 concurrent connections read status while shards fail and recover;
// every read gets a whole, well-formed answer.
func TestThousandReadersWhileShardsFlap(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections")
	}
	e := newEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// They all dial at once from one address, which fsrv's handshake
	// budgets exist to refuse; this test is about what they read.
	e.srv.MaxHandshakes, e.srv.MaxHandshakesPerAddr = 1000, 1000
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	}()

	const readers = 1000
	stop := make(chan struct{})
	flapped := make(chan int)
	go func() {
		n := 0
		defer func() { flapped <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := n % 4
			if c := e.tr.Last(id); c != nil {
				c.Link.Fail(core.Failure{Class: core.Transient, Err: errors.New("drop")})
			}
			e.clk.Advance(5 * time.Second)
			if c := e.tr.Last(id); c != nil {
				c.Link.Resumed(int64(n + 2))
			}
			n++
		}
	}()

	// Every reader connects and attaches first; all read at once; none
	// hangs up before all have read: 1,000 connections open together.
	var attached, done, wg sync.WaitGroup
	attached.Add(readers)
	done.Add(readers)
	start := make(chan struct{})
	errs := make(chan error, readers)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var root p9.File
			conn, err := net.Dial("tcp", l.Addr().String())
			if err == nil {
				var cl *p9.Client
				if cl, err = p9.NewClient(conn); err == nil {
					defer cl.Close()
					root, err = cl.Attach("")
				}
			}
			attached.Done()
			defer func() { done.Done(); done.Wait() }()
			if err != nil {
				errs <- err
				return
			}
			<-start
			text, err := read(root, "status")
			if err != nil {
				errs <- fmt.Errorf("reader %d: %w", i, err)
				return
			}
			lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
			if len(lines) != 4 {
				errs <- fmt.Errorf("reader %d: status = %q; want 4 lines", i, text)
				return
			}
			for _, line := range lines {
				if f := strings.Fields(line); len(f) != 5 {
					errs <- errors.New("malformed status line " + line)
					return
				}
			}
		}()
	}
	attached.Wait()
	if open := e.srv.Connections(); open != readers {
		t.Errorf("%d connections open before the reads; want %d", open, readers)
	}
	close(start)
	wg.Wait()
	close(stop)
	n := <-flapped
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n == 0 {
		t.Error("no shard flapped while the readers read")
	}
	t.Logf("%d readers answered while shards flapped %d times", readers, n)
}
