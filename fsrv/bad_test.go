package fsrv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// Bad input: each case gets its error, and the server goes on serving
// other connections.

// rawConn dials addr and returns the connection, closed at the end of the
// test.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// replyAndHangup reads what the server sends until it closes the
// connection, with a bound.
func replyAndHangup(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	// A server that closes with unread input makes the kernel reset the
	// connection: that is a hang-up too.
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading until the server hangs up: %v", err)
	}
	return b
}

// stillServes checks that a new connection is served normally.
func stillServes(t *testing.T, addr string) {
	t.Helper()
	_, root := dialDotL(t, addr)
	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Fatalf("after bad input, read status = %q; want %q", got, "READY\n")
	}
	fsys := dial9(t, addr)
	if _, err := fsys.Stat("status"); err != nil {
		t.Fatalf("after bad input, 9P2000 Stat(status) = %v", err)
	}
}

func TestBadInput(t *testing.T) {
	attach := plan9.Fcall{Type: plan9.Tattach, Tag: 1, Fid: 1, Afid: plan9.NOFID, Uname: "glenda"}
	attachFrame, _ := attach.Bytes()
	tests := []struct {
		name  string
		send  []byte
		reply []byte // nil: dropped without a reply
	}{
		{
			name:  "first message not Tversion",
			send:  attachFrame,
			reply: rerror(1, "invalid argument: the first message must be Tversion"),
		},
		{
			name: "size larger than a Tversion can be",
			send: []byte{0xff, 0xff, 0xff, 0xff, msgTversion, 0, 0},
		},
		{
			name: "size smaller than a header",
			send: []byte{3, 0, 0, 0, msgTversion, 0, 0},
		},
		{
			name:  "Tversion with a string longer than its frame",
			send:  finish(append(newFrame(msgTversion, noTag), 0, 32, 0, 0, 50, 0, '9')),
			reply: rerror(noTag, "invalid argument: malformed Tversion"),
		},
		{
			name:  "msize below the minimum, 9P2000.L",
			send:  versionFrame(msgTversion, noTag, 100, "9P2000.L"),
			reply: rlerror(noTag, linux.EINVAL),
		},
		{
			name:  "msize below the minimum, 9P2000",
			send:  versionFrame(msgTversion, noTag, 100, "9P2000"),
			reply: rerror(noTag, "invalid argument: msize 100 is below the minimum 256"),
		},
		{
			name: "unknown versions, then hang up",
			send: append(versionFrame(msgTversion, noTag, 8192, "9P1999"), versionFrame(msgTversion, 1, 8192, "HTTP/1.1")...),
			reply: append(versionFrame(msgRversion, noTag, 8192, "unknown"),
				versionFrame(msgRversion, 1, 8192, "unknown")...),
		},
	}
	fx := newFixture()
	srv := fx.server(t)
	srv.VersionTimeout = 5 * time.Second
	addr := listen(t, srv)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := rawConn(t, addr)
			if _, err := c.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(tt.name, "unknown") {
				c.(*net.TCPConn).CloseWrite()
			}
			if got := replyAndHangup(t, c); !bytes.Equal(got, tt.reply) {
				t.Errorf("reply = %q; want %q and the connection closed", got, tt.reply)
			}
			stillServes(t, addr)
		})
	}
}

// TestUnknownVersionThenKnown checks that a client answered "unknown" may
// propose another version on the same connection.
func TestUnknownVersionThenKnown(t *testing.T) {
	fx := newFixture()
	c := pipe(t, fx.server(t))
	go c.Write(versionFrame(msgTversion, noTag, 8192, "9P3000"))
	if got, err := readFrame(c, 1<<16); err != nil || !bytes.Equal(got, versionFrame(msgRversion, noTag, 8192, "unknown")) {
		t.Fatalf("reply to 9P3000 = %q, %v; want Rversion unknown", got, err)
	}
	cl, err := p9.NewClient(c)
	if err != nil {
		t.Fatalf("then p9.NewClient = %v; want nil", err)
	}
	root, err := cl.Attach("")
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Errorf("read status = %q", got)
	}
}

// TestVersionTimeout: a client that sends part of a Tversion and stalls is
// dropped after VersionTimeout, as is one that sends nothing.
func TestVersionTimeout(t *testing.T) {
	fx := newFixture()
	srv := fx.server(t)
	srv.VersionTimeout = 20 * time.Millisecond
	addr := listen(t, srv)
	for _, send := range [][]byte{
		versionFrame(msgTversion, noTag, 8192, "9P2000.L")[:9], // the frame says 19 bytes
		nil,
	} {
		c := rawConn(t, addr)
		c.Write(send)
		if got := replyAndHangup(t, c); len(got) != 0 {
			t.Errorf("reply = %q; want none and the connection closed", got)
		}
	}
	stillServes(t, addr)
}

// TestOversizedFrameInSession: once a session is up, a frame larger than
// the negotiated msize ends that connection and no other.
func TestOversizedFrameInSession(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for _, version := range []string{"9P2000.L", "9P2000"} {
		c := rawConn(t, addr)
		c.Write(versionFrame(msgTversion, noTag, 8192, version))
		if _, err := readFrame(c, 1<<16); err != nil {
			t.Fatalf("%s: Rversion: %v", version, err)
		}
		frame := make([]byte, 8192+1)
		binary.LittleEndian.PutUint32(frame, uint32(len(frame)))
		frame[4] = 116 // Tread
		c.Write(frame)
		if got := replyAndHangup(t, c); len(got) != 0 {
			t.Errorf("%s: reply = %q; want none and the connection closed", version, got)
		}
	}
	stillServes(t, addr)
}

// TestLargeCtlWrite: a write over 64 KiB is refused with EFBIG (9P2000.L)
// or "invalid argument: write too large" (9P2000) before any line is
// applied; 64 KiB exactly is accepted.
func TestLargeCtlWrite(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	big := strings.Repeat("stop\n", MaxCtlWrite/5+1)
	ok := strings.Repeat("stop\n", MaxCtlWrite/5)

	_, root := dialDotL(t, addr, p9.WithMessageSize(256<<10))
	if err := writeDotL(root, "ctl", big); !errors.Is(err, linux.EFBIG) {
		t.Errorf("9P2000.L write of %d bytes = %v; want EFBIG", len(big), err)
	}
	if h := fx.takeHandled(); len(h) != 0 {
		t.Errorf("after a refused write, %d lines were handled; want 0", len(h))
	}
	if err := writeDotL(root, "ctl", ok); err != nil {
		t.Errorf("9P2000.L write of %d bytes = %v; want nil", len(ok), err)
	}
	if h := fx.takeHandled(); len(h) != len(ok)/5 {
		t.Errorf("handled %d lines; want %d", len(h), len(ok)/5)
	}

	// The 9fans client splits writes at its msize (8 KiB), so send the
	// messages by hand to get one Twrite of more than 64 KiB through.
	c := rawConn(t, addr)
	send := func(f *plan9.Fcall) *plan9.Fcall {
		t.Helper()
		if err := plan9.WriteFcall(c, f); err != nil {
			t.Fatal(err)
		}
		r, err := plan9.ReadFcall(c)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	send(&plan9.Fcall{Type: plan9.Tversion, Tag: plan9.NOTAG, Msize: 256 << 10, Version: "9P2000"})
	send(&plan9.Fcall{Type: plan9.Tattach, Tag: 1, Fid: 1, Afid: plan9.NOFID, Uname: "glenda"})
	send(&plan9.Fcall{Type: plan9.Twalk, Tag: 1, Fid: 1, Newfid: 2, Wname: []string{"ctl"}})
	send(&plan9.Fcall{Type: plan9.Topen, Tag: 1, Fid: 2, Mode: plan9.OWRITE})
	r := send(&plan9.Fcall{Type: plan9.Twrite, Tag: 1, Fid: 2, Data: []byte(big)})
	want := "invalid argument: write too large: 65540 bytes, the limit is 65536"
	if r.Type != plan9.Rerror || r.Ename != want {
		t.Errorf("9P2000 write of %d bytes = %v; want Rerror %q", len(big), r, want)
	}
	if h := fx.takeHandled(); len(h) != 0 {
		t.Errorf("after a refused write, %d lines were handled; want 0", len(h))
	}
	stillServes(t, addr)
}

// TestErrorFitsMsize: under 9P2000 an error that carries a long command
// is clipped so that its Rerror fits the negotiated msize; srv9p drops a
// reply that does not fit, and the client would wait for it forever.
func TestErrorFitsMsize(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for _, msize := range []uint32{MinMsize, 8192} {
		c := rawConn(t, addr)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		send := func(f *plan9.Fcall) *plan9.Fcall {
			t.Helper()
			if err := plan9.WriteFcall(c, f); err != nil {
				t.Fatal(err)
			}
			r, err := plan9.ReadFcall(c)
			if err != nil {
				t.Fatalf("msize %d: reply to %v: %v", msize, f.Type, err)
			}
			return r
		}
		send(&plan9.Fcall{Type: plan9.Tversion, Tag: plan9.NOTAG, Msize: msize, Version: "9P2000"})
		send(&plan9.Fcall{Type: plan9.Tattach, Tag: 1, Fid: 1, Afid: plan9.NOFID, Uname: "glenda"})
		send(&plan9.Fcall{Type: plan9.Twalk, Tag: 1, Fid: 1, Newfid: 2, Wname: []string{"ctl"}})
		send(&plan9.Fcall{Type: plan9.Topen, Tag: 1, Fid: 2, Mode: plan9.OWRITE})
		cmd := strings.Repeat("x", int(msize)-plan9.IOHDRSZ-1) // the largest Twrite
		r := send(&plan9.Fcall{Type: plan9.Twrite, Tag: 2, Fid: 2, Data: []byte(cmd + "\n")})
		b, _ := r.Bytes()
		prefix := `invalid argument: unknown command "xxxx`
		if r.Type != plan9.Rerror || r.Tag != 2 || len(b) > int(msize) || !strings.HasPrefix(r.Ename, prefix) || !strings.HasSuffix(r.Ename, "...") {
			t.Errorf("msize %d: reply = %v (%d bytes); want Rerror tag 2 of at most %d bytes, %q clipped with ...", msize, r.Type, len(b), msize, prefix)
		}
		r = send(&plan9.Fcall{Type: plan9.Twrite, Tag: 3, Fid: 2, Data: []byte("stop\n")})
		if r.Type != plan9.Rwrite || r.Count != 5 {
			t.Errorf("msize %d: then write stop = %v; want Rwrite 5", msize, r)
		}
	}
	stillServes(t, addr)
}

// dotlExchange sends a transcript line over c and returns the reply as
// text, with a bound.
func dotlExchange(t *testing.T, c net.Conn, frame []byte) string {
	t.Helper()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r, err := readFrame(c, 1<<20)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	m, err := decodeDotL(r, func(p uint64) uint64 { return 0 })
	if err != nil {
		t.Fatalf("undecodable reply %x: %v", r, err)
	}
	return m.String()
}

func dotlFrame(t *testing.T, line string) []byte {
	t.Helper()
	m, err := parseDotL(line)
	if err != nil {
		t.Fatal(err)
	}
	b, err := encodeDotL(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDotLWriteCountMismatch: a 9P2000.L Twrite whose count does not
// match its payload is answered EINVAL on its own tag (hugelgupf/p9
// answered on tag 65535, and the request's tag never got a reply), and
// the connection goes on.
func TestDotLWriteCountMismatch(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	c := rawConn(t, addr)
	for _, step := range []struct{ send, want string }{
		{"Tversion tag NOTAG msize 8192 version 9P2000.L", "Rversion tag 65535 msize 8192 version \"9P2000.L\""},
		{"Tattach tag 1 fid 1 afid NOFID uname root aname '' nuname 0", "Rattach tag 1 qid 0x0.0.d"},
		{"Twalk tag 1 fid 1 newfid 2 wname [ctl]", "Rwalk tag 1 wqid [0x0.0]"},
		{"Tlopen tag 1 fid 2 flags O_WRONLY", "Rlopen tag 1 qid 0x0.0 iounit 0"},
	} {
		if got := dotlExchange(t, c, dotlFrame(t, step.send)); got != step.want {
			t.Fatalf("%s: reply %s; want %s", step.send, got, step.want)
		}
	}
	for _, count := range []uint32{0, 4, 6, 1 << 20} {
		frame := dotlFrame(t, `Twrite tag 7 fid 2 offset 0 data "stop\n"`)
		binary.LittleEndian.PutUint32(frame[headerSize+12:], count)
		if got, want := dotlExchange(t, c, frame), "Rlerror tag 7 ecode EINVAL"; got != want {
			t.Errorf("Twrite of 5 bytes with count %d: reply %s; want %s", count, got, want)
		}
	}
	if got, want := dotlExchange(t, c, dotlFrame(t, `Twrite tag 8 fid 2 offset 0 data "stop\n"`)), "Rwrite tag 8 count 5"; got != want {
		t.Errorf("then a good Twrite: reply %s; want %s", got, want)
	}
	if h := fx.takeHandled(); !slices.Equal(h, []string{"stop"}) {
		t.Errorf("handled %q; want only the good write's stop", h)
	}
	stillServes(t, addr)
}

// TestDotLUndecodable: a request hugelgupf/p9 cannot decode (a Tclunk
// without its fid) would be answered on NOTAG and its own tag never; the
// server ends that connection instead, and serves the others.
func TestDotLUndecodable(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	c := rawConn(t, addr)
	dotlExchange(t, c, dotlFrame(t, "Tversion tag NOTAG msize 8192 version 9P2000.L"))
	c.Write(finish(newFrame(120, 9))) // Tclunk, no fid
	if got := replyAndHangup(t, c); len(got) != 0 {
		t.Errorf("reply = %x; want none and the connection closed", got)
	}
	stillServes(t, addr)
}
