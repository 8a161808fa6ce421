package relay

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxBatch bounds the bytes a held connection gathers before it writes
// them anyway.
const maxBatch = 256 << 10

// batchConn is a client's connection under the WebSocket library. While
// the puller holds it, the library's writes gather in memory and go out
// in one write when the puller releases it: a burst of dispatches costs
// the client one system call, not one per dispatch (the system call was
// most of the relay's CPU time per event). A single dispatch still goes
// out at once, held and released around it.
type batchConn struct {
	net.Conn

	wmu   sync.Mutex // one write to the socket at a time
	spare []byte     // the buffer last written, for the next gathering

	mu      sync.Mutex // taken after wmu when both are
	holding bool
	buf     []byte
}

// hold starts gathering writes.
func (b *batchConn) hold() {
	b.mu.Lock()
	b.holding = true
	b.mu.Unlock()
}

// release writes what was gathered and stops gathering.
func (b *batchConn) release() error {
	b.mu.Lock()
	b.holding = false
	b.mu.Unlock()
	return b.write(nil)
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	if b.holding && len(b.buf)+len(p) <= maxBatch {
		b.buf = append(b.buf, p...)
		b.mu.Unlock()
		return len(p), nil
	}
	b.mu.Unlock()
	if err := b.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// write writes the gathered bytes, then p.
func (b *batchConn) write(p []byte) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	pending := b.buf
	b.buf, b.spare = b.spare[:0], nil
	b.mu.Unlock()
	if len(pending) > 0 {
		if _, err := b.Conn.Write(pending); err != nil {
			return err
		}
	}
	if cap(pending) <= maxBatch {
		b.spare = pending // for the next gathering
	}
	if len(p) > 0 {
		_, err := b.Conn.Write(p)
		return err
	}
	return nil
}

// Close writes what was gathered (a close frame, when the connection is
// closed with a reason while the puller holds it), bounded by a second as
// the library bounds its close frame, then closes.
func (b *batchConn) Close() error {
	b.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	b.mu.Lock()
	b.holding = false
	b.mu.Unlock()
	b.write(nil)
	return b.Conn.Close()
}

// batchHijacker hands the WebSocket library a batchConn when it hijacks
// the HTTP connection.
type batchHijacker struct {
	http.ResponseWriter
	conn *batchConn
}

func (h *batchHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: the connection cannot be hijacked")
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.conn = &batchConn{Conn: c}
	return h.conn, rw, nil
}
