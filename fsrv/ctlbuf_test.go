package fsrv

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// chunkWriter is one open ctl fid that takes writes at offsets, as 9pfuse
// sends them.
type chunkWriter interface {
	WriteAt(p []byte, off int64) (int, error)
	Close() error
}

// ctlScript is a long multi-line command text and its lines.
func ctlScript(n int) (string, []string) {
	words := []string{"stop", "start", "lease 30s", "lease 2m"}
	var b strings.Builder
	var lines []string
	for i := range n {
		w := words[i%len(words)]
		lines = append(lines, w)
		b.WriteString(w + "\n")
	}
	return b.String(), lines
}

// writeChunks writes text in 4 KiB writes at increasing offsets, the way
// 9pfuse passes a long write(2) on, checking each write's count. It
// returns the error of the first write that fails and the number of
// bytes written before it.
func writeChunks(t *testing.T, w chunkWriter, text string, after func(off int)) (int, error) {
	t.Helper()
	const chunk = 4096
	for off := 0; off < len(text); off += chunk {
		p := text[off:min(off+chunk, len(text))]
		n, err := w.WriteAt([]byte(p), int64(off))
		if err != nil {
			return off, err
		}
		if n != len(p) {
			t.Fatalf("WriteAt(%d bytes at %d) = %d; want the full count", len(p), off, n)
		}
		if after != nil {
			after(off + len(p))
		}
	}
	return len(text), nil
}

// openCtl opens /ctl for writing in each dialect.
func openCtl(t *testing.T, addr string) map[string]chunkWriter {
	t.Helper()
	_, root := dialDotL(t, addr)
	_, f, err := root.Walk([]string{"ctl"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		t.Fatal(err)
	}
	fid, err := dial9(t, addr).Open("ctl", plan9.OWRITE)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]chunkWriter{"9P2000.L": f, "9P2000": fid}
}

// TestCtlChunks: a long multi-line write cut into 4 KiB chunks applies
// every line once, whole, in order; a cut line waits for the chunk that
// completes it.
func TestCtlChunks(t *testing.T) {
	text, lines := ctlScript(3000)
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for dialect, w := range openCtl(t, addr) {
		var got []string
		_, err := writeChunks(t, w, text, func(end int) {
			got = append(got, fx.takeHandled()...)
			// Exactly the lines that ended within the bytes written.
			if want := strings.Count(text[:end], "\n"); len(got) != want {
				t.Fatalf("%s: after %d bytes, %d lines handled; want %d", dialect, end, len(got), want)
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", dialect, err)
		}
		if !slices.Equal(got, lines) {
			t.Errorf("%s: handled %d lines, not the %d written in order", dialect, len(got), len(lines))
		}
		if err := w.Close(); err != nil {
			t.Errorf("%s: clunk = %v; want nil", dialect, err)
		}
		if h := fx.takeHandled(); len(h) != 0 {
			t.Errorf("%s: clunk handled %q; want nothing", dialect, h)
		}
	}
}

// TestCtlChunkError: a bad line cut by a chunk boundary is the error of
// the chunk that completes it; the lines before it stay applied and none
// after it is.
func TestCtlChunkError(t *testing.T) {
	text, lines := ctlScript(3000)
	// A line that starts before 4096 and ends after it.
	bad := strings.LastIndex(text[:4090], "\n") + 1
	text = text[:bad] + "frobnicate-the-widget\n" + text[bad:]
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for dialect, w := range openCtl(t, addr) {
		off, err := writeChunks(t, w, text, nil)
		switch dialect {
		case "9P2000.L":
			if !errors.Is(err, linux.EINVAL) {
				t.Errorf("%s: error %v; want EINVAL", dialect, err)
			}
		default:
			if err == nil || err.Error() != `invalid argument: unknown command "frobnicate-the-widget"` {
				t.Errorf("%s: error %v; want the unknown command", dialect, err)
			}
		}
		if off != 4096 {
			t.Errorf("%s: the write at %d failed; want the one at 4096, which completes the line", dialect, off)
		}
		want := lines[:strings.Count(text[:bad], "\n")]
		if got := fx.takeHandled(); !slices.Equal(got, want) {
			t.Errorf("%s: handled %d lines; want the %d before the bad one", dialect, len(got), len(want))
		}
		// What followed the bad line in its write is gone. A client that
		// resends the rest of the write (a short count through 9pfuse or
		// the kernel) gets the error again: the rest of the bad line
		// never runs as a command. The fid goes on with the next write.
		if n, err := w.WriteAt([]byte(text[4096:]), 4096); n != 0 || err == nil {
			t.Errorf("%s: resend = %d, %v; want 0 and the error", dialect, n, err)
		}
		if n, err := w.WriteAt([]byte("stop\n"), int64(len(text))); n != 5 || err != nil {
			t.Errorf("%s: then write stop = %d, %v; want 5, nil", dialect, n, err)
		}
		if got := fx.takeHandled(); !slices.Equal(got, []string{"stop"}) {
			t.Errorf("%s: then handled %q; want stop", dialect, got)
		}
		w.Close()
	}
}

// padCut is a 4 KiB write, a client's cut of a longer one, that ends in
// the start of a line.
func padCut(start string) []byte {
	return []byte(strings.Repeat("\n", 4096-len(start)) + start)
}

// TestCtlPartialAtClunk: a last line left without its newline by a
// client's cut is applied when the fid is clunked; under 9P2000.L its
// error is the clunk's.
func TestCtlPartialAtClunk(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for dialect, w := range openCtl(t, addr) {
		w.WriteAt(padCut("lease 30s"), 0)
		if h := fx.takeHandled(); len(h) != 0 {
			t.Errorf("%s: before clunk, handled %q; want nothing", dialect, h)
		}
		if err := w.Close(); err != nil {
			t.Errorf("%s: clunk = %v; want nil", dialect, err)
		}
		if h := fx.takeHandled(); !slices.Equal(h, []string{"lease 30s"}) {
			t.Errorf("%s: at clunk, handled %q; want lease 30s", dialect, h)
		}
	}
	_, root := dialDotL(t, addr)
	_, f, _ := root.Walk([]string{"ctl"})
	f.Open(p9.WriteOnly)
	f.WriteAt(padCut("frob"), 0)
	if err := f.Close(); !errors.Is(err, linux.EINVAL) {
		t.Errorf("9P2000.L clunk after frob = %v; want EINVAL", err)
	}
}

// TestCtlLibraryCut: hugelgupf/p9's client cuts a long write at
// msize-512 bytes (65,024 at msize 64 KiB), neither msize-24 nor a 4 KiB
// page: the cut "stop 1" of "stop 10" ran as a command (attack21b F5). A
// write of a multiple of 512 bytes is a cut: its last line waits for the
// next write.
func TestCtlLibraryCut(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for dialect, w := range openCtl(t, addr) {
		const cut = 65024
		first := []byte(strings.Repeat("\n", cut-len("stop 1")) + "stop 1")
		if n, err := w.WriteAt(first, 0); n != cut || err != nil {
			t.Fatalf("%s: the first %d bytes: write = %d, %v", dialect, cut, n, err)
		}
		if h := fx.takeHandled(); len(h) != 0 {
			t.Errorf("%s: after the cut, handled %q; want nothing", dialect, h)
		}
		if n, err := w.WriteAt([]byte("0\n"), cut); n != 2 || err != nil {
			t.Errorf("%s: the rest: write = %d, %v", dialect, n, err)
		}
		if h := fx.takeHandled(); !slices.Equal(h, []string{"stop 10"}) {
			t.Errorf("%s: handled %q; want stop 10 whole", dialect, h)
		}
		w.Close()
	}
}

// TestCtlPartialConnectionLost: a connection that ends without a clunk
// drops the line a client's cut left without a newline: its end may never
// have been sent ("lease 3" of "lease 30s").
func TestCtlPartialConnectionLost(t *testing.T) {
	for _, dialect := range []string{"9P2000.L", "9P2000"} {
		fx := newFixture()
		srv := fx.server(t)
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.ServeConn(context.Background(), server)
		}()
		var w chunkWriter
		if dialect == "9P2000.L" {
			cl, err := p9.NewClient(client)
			if err != nil {
				t.Fatal(err)
			}
			root, err := cl.Attach("")
			if err != nil {
				t.Fatal(err)
			}
			_, f, _ := root.Walk([]string{"ctl"})
			if _, _, err := f.Open(p9.WriteOnly); err != nil {
				t.Fatal(err)
			}
			w = f
		} else {
			w = open9(t, client)
		}
		if n, err := w.WriteAt(padCut("stop\nlease 3"), 0); n != 4096 || err != nil {
			t.Fatalf("%s: write = %d, %v", dialect, n, err)
		}
		client.Close()
		<-done
		if h := fx.takeHandled(); !slices.Equal(h, []string{"stop"}) {
			t.Errorf("%s: handled %q; want only stop", dialect, h)
		}
	}
}

// open9 opens /ctl for writing over c with the 9P2000 client.
func open9(t *testing.T, c net.Conn) chunkWriter {
	t.Helper()
	conn, err := client.NewConn(c)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		t.Fatal(err)
	}
	fid, err := fsys.Open("ctl", plan9.OWRITE)
	if err != nil {
		t.Fatal(err)
	}
	return fid
}
