package gateway

import (
	"io"
	"net"
	"sync"
	"syscall"
)

// idleConn is the net.Conn gorilla reads a plain-TCP gateway connection
// through. It follows the server's WebSocket frames as gorilla reads them,
// so that the connection's reader can tell when gorilla holds no unread
// byte and wait for the socket itself.
//
// Why: a goroutine parked inside gorilla's read path has about 1.4 KiB of
// frames on its stack, and the runtime only halves a stack whose use (plus
// 800 bytes of slack) is under a quarter of it, so every idle shard would
// keep an 8 KiB stack. Parked in waitReadable instead, the stack shrinks
// to 4 KiB: a third of an idle shard's cost. TLS connections do the same
// over a recordConn, which keeps crypto/tls from holding bytes the socket
// no longer shows; compressed ones park inside their decompressor and read
// as usual.
//
// Over TLS it also reads ahead for gorilla: a read of crypto/tls takes a
// whole record's plaintext into a pooled buffer, which goes back to the
// pool once gorilla has taken every byte, so that crypto/tls holds none.
// On plain TCP gorilla's own buffer reads ahead, and only the bytes
// waitReadable took from the socket wait here. An idle connection holds
// no buffer of ours.
type idleConn struct {
	net.Conn
	fd    int // the socket, for the idler; -1 when unknown
	rc    syscall.RawConn
	ready func(fd uintptr) bool // allocated once: rc.Read takes a func
	t     frameTracker

	// in holds bytes read ahead for gorilla: what waitReadable took from
	// a plain socket (readPool), or reads of crypto/tls (tlsReadPool),
	// whose Read must be able to take a whole record's plaintext (see
	// recordConn). A read of at least size bytes goes straight through:
	// 0 on plain TCP, where gorilla's own buffer reads ahead.
	in   aheadBuf
	size int
	rec  *recordConn // under crypto/tls; nil on plain TCP
	// sock is where waitReadable puts what the socket has: in, or the
	// recordConn's buffer under crypto/tls.
	sock *aheadBuf
}

// readAhead is the most waitReadable takes from a plain socket at once.
const readAhead = 4096

var readPool = sync.Pool{New: func() any {
	b := make([]byte, readAhead)
	return &b
}}

func newIdleConn(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok || !canWaitReadable {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	// Plain TCP reads go straight to the socket: gorilla's own buffer does
	// the reading ahead (reading ahead here as well cost twice the CPU per
	// event under a flood, BenchmarkDispatch). Only what waitReadable
	// takes from the socket is held here.
	return newIdle(nc, rc, &readPool, 0, nil)
}

func newIdle(nc net.Conn, rc syscall.RawConn, pool *sync.Pool, size int, rec *recordConn) *idleConn {
	c := &idleConn{Conn: nc, rc: rc, fd: -1, in: aheadBuf{pool: pool}, size: size, rec: rec}
	c.sock = &c.in
	if rec != nil {
		c.sock = &rec.in
	}
	c.ready = c.readable
	_ = rc.Control(func(fd uintptr) { c.fd = int(fd) })
	return c
}

func (c *idleConn) Read(p []byte) (int, error) {
	if !c.in.buffered() {
		if len(p) >= c.size {
			n, err := c.Conn.Read(p)
			c.t.feed(p[:n])
			return n, err
		}
		c.in.fill(c.Conn)
	}
	n, err := c.in.take(p)
	c.t.feed(p[:n])
	return n, err
}

// buffered reports whether bytes (or an error) read from the socket wait
// for gorilla, here or under crypto/tls: then there is no need to wait for
// the socket.
func (c *idleConn) buffered() bool {
	return c.in.buffered() || (c.rec != nil && c.rec.in.buffered())
}

// aheadBuf holds bytes read from a socket before their reader asked for
// them, in a buffer from pool that goes back once the last byte is taken.
type aheadBuf struct {
	pool   *sync.Pool
	b      *[]byte // [off:n] not taken yet; nil when empty
	off, n int
	err    error // what the socket said after those bytes
}

func (a *aheadBuf) buffered() bool { return a.b != nil || a.err != nil }

// fill reads r once into a pooled buffer; a is empty.
func (a *aheadBuf) fill(r io.Reader) {
	b := a.pool.Get().(*[]byte)
	n, err := r.Read(*b)
	a.set(b, n, err)
}

func (a *aheadBuf) set(b *[]byte, n int, err error) {
	if n == 0 {
		a.pool.Put(b)
		b = nil
	}
	a.b, a.off, a.n, a.err = b, 0, n, err
}

// take copies buffered bytes into p, or returns the error that followed
// them once they are all taken.
func (a *aheadBuf) take(p []byte) (int, error) {
	if a.b == nil {
		err := a.err
		a.err = nil
		return 0, err
	}
	n := copy(p, (*a.b)[a.off:a.n])
	a.off += n
	if a.off == a.n {
		a.pool.Put(a.b)
		a.b = nil
	}
	return n, nil
}

// waitReadable returns once the socket has given what it has to the
// read-ahead buffer (one system call, as a read would be), has failed, or
// its read deadline (Close sets one) has passed.
func (c *idleConn) waitReadable() {
	_ = c.rc.Read(c.ready)
}

// frameTracker follows the frames of a server-to-client WebSocket byte
// stream, after the HTTP upgrade response, counting the data frames that
// end a message and the bytes that came after the last of them.
type frameTracker struct {
	crlf     int  // how much of "\r\n\r\n" ends the bytes so far (HTTP response)
	inFrames bool // past the HTTP response
	hdr      [14]byte
	hn       int   // header bytes collected
	remain   int64 // payload bytes of the current frame still to come
	inFrame  bool  // the header is complete and payload remains
	// messages counts complete data frames with FIN set; after counts the
	// bytes seen since the last of them ended.
	messages int64
	after    int64
}

// quiet reports whether every byte read so far belongs to the first
// consumed messages: gorilla, having handed those over, holds nothing.
func (t *frameTracker) quiet(consumed int64) bool {
	return t.inFrames && t.messages == consumed && t.after == 0
}

func (t *frameTracker) feed(b []byte) {
	for len(b) > 0 {
		if !t.inFrames {
			c := b[0]
			b = b[1:]
			switch {
			case c == '\r' && (t.crlf == 0 || t.crlf == 2):
				t.crlf++
			case c == '\n' && (t.crlf == 1 || t.crlf == 3):
				t.crlf++
			case c == '\r':
				t.crlf = 1
			default:
				t.crlf = 0
			}
			if t.crlf == 4 {
				t.inFrames = true
			}
			continue
		}
		if t.inFrame {
			k := min(int64(len(b)), t.remain)
			t.remain -= k
			t.after += k
			b = b[k:]
			if t.remain == 0 {
				t.frameDone()
			}
			continue
		}
		// Header bytes: 2, then 2 or 8 of length, then 4 of mask.
		t.hdr[t.hn] = b[0]
		t.hn++
		t.after++
		b = b[1:]
		if t.hn < 2 {
			continue
		}
		need := 2
		switch t.hdr[1] & 0x7f {
		case 126:
			need += 2
		case 127:
			need += 8
		}
		if t.hdr[1]&0x80 != 0 {
			need += 4
		}
		if t.hn < need {
			continue
		}
		var n uint64
		switch l := t.hdr[1] & 0x7f; l {
		case 126:
			n = uint64(t.hdr[2])<<8 | uint64(t.hdr[3])
		case 127:
			for _, x := range t.hdr[2:10] {
				n = n<<8 | uint64(x)
			}
		default:
			n = uint64(l)
		}
		t.remain = int64(min(n, 1<<62))
		t.inFrame = true
		if t.remain == 0 {
			t.frameDone()
		}
	}
}

// frameDone ends the current frame: a data frame (continuation, text or
// binary) with FIN set ends a message.
func (t *frameTracker) frameDone() {
	op, fin := t.hdr[0]&0x0f, t.hdr[0]&0x80 != 0
	if fin && op <= 2 {
		t.messages++
		t.after = 0
	}
	t.hn, t.inFrame = 0, false
}

// readBufferSize is gorilla's read buffer per connection. Over TLS
// idleConn reads ahead for it from a pool, and a smaller one would do; on
// plain TCP it is what reads ahead.
const readBufferSize = 512
