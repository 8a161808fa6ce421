package gateway

import (
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
// It also reads ahead for gorilla, whose own buffer is kept at its minimum
// (readBufferSize): a read of the socket takes up to readAhead bytes into
// a pooled buffer, which goes back to the pool once gorilla has taken
// every byte. Under load one read brings several messages; an idle
// connection holds no buffer at all.
type idleConn struct {
	net.Conn
	fd    int // the socket, for the idler; -1 when unknown
	rc    syscall.RawConn
	ready func(fd uintptr) bool // allocated once: rc.Read takes a func
	peek  [1]byte
	t     frameTracker

	// Read-ahead buffers come from pool and hold size bytes: readPool, or
	// tlsReadPool over crypto/tls, whose Read must be able to take a whole
	// record's plaintext (see recordConn).
	pool *sync.Pool
	size int
	rec  *recordConn // under crypto/tls; nil on plain TCP

	ahead    *[]byte // bytes read ahead, [aheadOff:aheadLen] not taken yet; nil when none
	aheadOff int
	aheadLen int
	aheadErr error // what the socket said after the bytes read ahead
}

// readAhead is the most one read of the socket takes when gorilla asks for
// less.
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
	return newIdle(nc, rc, &readPool, readAhead, nil)
}

func newIdle(nc net.Conn, rc syscall.RawConn, pool *sync.Pool, size int, rec *recordConn) *idleConn {
	c := &idleConn{Conn: nc, rc: rc, fd: -1, pool: pool, size: size, rec: rec}
	c.ready = c.readable
	_ = rc.Control(func(fd uintptr) { c.fd = int(fd) })
	return c
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.ahead == nil {
		if err := c.aheadErr; err != nil {
			c.aheadErr = nil
			return 0, err
		}
		if len(p) >= c.size {
			n, err := c.Conn.Read(p)
			c.t.feed(p[:n])
			return n, err
		}
		b := c.pool.Get().(*[]byte)
		n, err := c.Conn.Read(*b)
		if n == 0 {
			c.pool.Put(b)
			return 0, err
		}
		c.ahead, c.aheadOff, c.aheadLen, c.aheadErr = b, 0, n, err
	}
	n := copy(p, (*c.ahead)[c.aheadOff:c.aheadLen])
	c.aheadOff += n
	if c.aheadOff == c.aheadLen {
		c.pool.Put(c.ahead)
		c.ahead = nil
	}
	c.t.feed(p[:n])
	return n, nil
}

// buffered reports whether bytes (or an error) read from the socket wait
// for gorilla, here or under crypto/tls: then there is no need to wait for
// the socket.
func (c *idleConn) buffered() bool {
	return c.ahead != nil || c.aheadErr != nil || (c.rec != nil && c.rec.buffered())
}

// waitReadable returns once the socket has a byte to read, has failed, or
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

// readBufferSize is gorilla's read buffer per connection: the smallest it
// takes (a control frame's payload). idleConn reads ahead for it from a
// pool, so a larger one would hold memory for the connection's whole life
// and save no read.
const readBufferSize = 125
