package fsrv

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/p9"
)

// TestManyConnections reads /status over many connections at once, both
// dialects, while another goroutine keeps changing it: every read of one
// open must see one of the values whole, never a mix.
func TestManyConnections(t *testing.T) {
	const conns = 1000
	values := []string{
		"READY\n",
		strings.Repeat("b", 3000) + "\n",
		strings.Repeat("c", 9000) + "\n", // more than one 8 KiB message
	}
	valid := map[string]bool{}
	for _, v := range values {
		valid[v] = true
	}
	fx := newFixture()
	srv := fx.server(t)
	// A thousand connections under -race on a loaded machine: a Tversion
	// may wait longer than the default bound meant for stalled clients.
	srv.VersionTimeout = 5 * time.Minute
	// All of them dial at once from one address, which the handshake
	// budgets exist to refuse; this test is about what each one reads.
	srv.MaxHandshakes, srv.MaxHandshakesPerAddr = conns, conns
	addr := listen(t, srv)

	stop := make(chan struct{})
	var changes atomic.Int64
	var mutator sync.WaitGroup
	mutator.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			fx.setStatus(values[i%len(values)])
			changes.Add(1)
		}
	})

	errs := make(chan error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			var err error
			if i%4 == 3 {
				err = readMany9(addr, valid)
			} else {
				err = readManyDotL(addr, valid)
			}
			if err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(stop)
	mutator.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 5 {
		t.Errorf("... and %d more", n-5)
	}
	if changes.Load() < 2 {
		t.Errorf("status changed %d times during the test; want it to change", changes.Load())
	}
}

const readsPerConn = 3

func readManyDotL(addr string, valid map[string]bool) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	cl, err := p9.NewClient(c, p9.WithMessageSize(8192))
	if err != nil {
		c.Close()
		return err
	}
	defer cl.Close()
	root, err := cl.Attach("")
	if err != nil {
		return err
	}
	for range readsPerConn {
		_, f, err := root.Walk([]string{"status"})
		if err != nil {
			return err
		}
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			return err
		}
		var got []byte
		buf := make([]byte, 1000)
		for {
			n, err := f.ReadAt(buf, int64(len(got)))
			got = append(got, buf[:n]...)
			if n == 0 || err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		f.Close()
		if !valid[string(got)] {
			return fmt.Errorf("9P2000.L read %d bytes starting %.10q: not one of the values", len(got), got)
		}
	}
	return nil
}

func readMany9(addr string, valid map[string]bool) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	conn, err := client.NewConn(c)
	if err != nil {
		c.Close()
		return err
	}
	defer conn.Close()
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		return err
	}
	for range readsPerConn {
		fid, err := fsys.Open("status", plan9.OREAD)
		if err != nil {
			return err
		}
		got, err := io.ReadAll(fid)
		fid.Close()
		if err != nil {
			return err
		}
		if !valid[string(got)] {
			return fmt.Errorf("9P2000 read %d bytes starting %.10q: not one of the values", len(got), got)
		}
	}
	return nil
}

// TestCloseEndsEverything: Close ends Serve and every connection, and
// returns when none is being served.
func TestCloseEndsEverything(t *testing.T) {
	fx := newFixture()
	srv := fx.server(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), l) }()
	_, root := dialDotL(t, l.Addr().String())
	fsys := dial9(t, l.Addr().String())
	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Fatalf("read status = %q", got)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close = %v; want nil", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v; want nil after Close", err)
	}
	if _, err := fsys.Stat("status"); err == nil {
		t.Errorf("9P2000 Stat after Close = nil; want an error")
	}
	if _, _, err := root.Walk([]string{"status"}); err == nil {
		t.Errorf("9P2000.L Walk after Close = nil; want an error")
	}
	a, b := net.Pipe()
	defer a.Close()
	if err := srv.ServeConn(context.Background(), b); err != ErrServerClosed {
		t.Errorf("ServeConn after Close = %v; want ErrServerClosed", err)
	}
}

// TestContextEndsServeConn: cancelling the context ends a connection that
// is in the middle of a session.
func TestContextEndsServeConn(t *testing.T) {
	fx := newFixture()
	srv := fx.server(t)
	a, b := net.Pipe()
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(ctx, b) }()
	cl, err := p9.NewClient(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Attach(""); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeConn = %v; want nil", err)
	}
}
