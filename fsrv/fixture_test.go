package fsrv

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/journal"
)

// The journal is the log the project serves; check here that it fits.
var _ LogSource = (*journal.Log)(nil)

// fixture is the tree most tests serve:
//
//	/ctl     rw  commands: stop, start, lease D; "busy" fails with ErrBusy,
//	             "explode" panics, anything else is an unknown command
//	/send    w   records every line; private
//	/status  r   settable text, "READY\n" at first
//	/events  r   a journal with a small retention
//	/1/state r   "STARTING\n"
type fixture struct {
	clock  *clock.Fake
	events *journal.Log
	root   *Dir
	ctl    *Ctl

	mu      sync.Mutex
	status  string
	handled []string
}

func newFixture() *fixture {
	f := &fixture{clock: clock.NewFake(), events: journal.New(300), status: "READY\n"}
	f.ctl = &Ctl{
		Name: "ctl",
		Handle: func(line string) error {
			cmd, _, _ := strings.Cut(line, " ")
			switch cmd {
			case "stop", "start", "lease":
			case "busy":
				return fmt.Errorf("%w: shard 3 is starting", ErrBusy)
			case "explode":
				panic("explode")
			default:
				return fmt.Errorf("%w: unknown command %q", fs.ErrInvalid, cmd)
			}
			f.mu.Lock()
			f.handled = append(f.handled, line)
			f.mu.Unlock()
			return nil
		},
		Usage: func() string { return "stop\nstart\nlease DURATION\n" },
	}
	send := &Ctl{Name: "send", Private: true, Handle: func(line string) error {
		f.mu.Lock()
		f.handled = append(f.handled, "send "+line)
		f.mu.Unlock()
		return nil
	}}
	status := &Text{Name: "status", Content: func() []byte {
		f.mu.Lock()
		defer f.mu.Unlock()
		return []byte(f.status)
	}}
	shard := NewDir("1", &Text{Name: "state", Content: func() []byte { return []byte("STARTING\n") }})
	f.root = NewDir("", f.ctl, send, status, &LogFile{Name: "events", Source: f.events}, shard)
	return f
}

func (f *fixture) setStatus(s string) {
	f.mu.Lock()
	f.status = s
	f.mu.Unlock()
}

// takeHandled returns the lines handled since the last call.
func (f *fixture) takeHandled() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.handled
	f.handled = nil
	return h
}

func (f *fixture) appendEvent(line string) {
	f.events.Append([]byte(line), f.clock.Now())
}

func (f *fixture) server(t testing.TB) *Server {
	return &Server{Root: f.root, Clock: f.clock, Logger: testLogger(t)}
}

// testLogger writes to t.Log, so that a failing test shows what the server
// said, until t's cleanups run: a connection's goroutine may still log
// after the test (a clunk's line), and t.Log then races the testing
// package's end of t (a race the detector reported in CI).
func testLogger(t testing.TB) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool // t has ended: its Log may no longer be called
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// listen serves srv on a loopback TCP port until the test ends.
func listen(t testing.TB, srv *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, srv, l)
}

// serveOn serves srv on l until the test ends.
func serveOn(t testing.TB, srv *Server, l net.Listener) string {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v; want nil", err)
		}
	})
	return l.Addr().String()
}

// pipe serves srv on one end of an in-memory connection and returns the
// other end; the test's cleanup waits for ServeConn to return.
func pipe(t testing.TB, srv *Server) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(context.Background(), server)
	}()
	t.Cleanup(func() {
		client.Close()
		<-done
	})
	return client
}
