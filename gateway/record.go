package gateway

import (
	"crypto/tls"
	"net"
	"sync"
)

// A TLS connection may wait for the socket, and park, like a plain one
// (see idleConn) only when no byte the socket has delivered waits in user
// space. crypto/tls keeps two such buffers: the plaintext of the record
// being read, and ciphertext read from the socket past it. The first is
// empty whenever its Read is given room for a whole record's plaintext
// (idleConn reads ahead in buffers of maxPlaintext); the second is empty
// whenever its reads of the network never go past the record it is
// reading: recordConn, under crypto/tls, sees to that.
//
// recordConn reads the socket ahead into a pooled buffer, as idleConn does
// for gorilla, and hands crypto/tls at most the rest of the current
// record's header or body per Read, so that one read of the socket still
// serves many records under load. It holds no buffer once crypto/tls has
// every byte it read.
type recordConn struct {
	net.Conn
	hdr  [recordHeader]byte
	hn   int // header bytes handed over of the current record
	rest int // body bytes of the current record not handed over yet
	in   aheadBuf
}

const (
	recordHeader = 5       // type, version, length
	maxPlaintext = 1 << 14 // the most plaintext one TLS record carries
)

// recordPool holds recordConn's read-ahead buffers; tlsReadPool idleConn's
// over crypto/tls.
var (
	recordPool  = sync.Pool{New: func() any { b := make([]byte, maxPlaintext+2*recordHeader+256); return &b }}
	tlsReadPool = sync.Pool{New: func() any { b := make([]byte, maxPlaintext); return &b }}
)

func (r *recordConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if !r.in.buffered() {
		r.in.fill(r.Conn)
	}
	limit := r.rest
	if limit == 0 {
		limit = recordHeader - r.hn
	}
	n, err := r.in.take(p[:min(len(p), limit)])
	if r.rest > 0 {
		r.rest -= n
	} else {
		r.hn += copy(r.hdr[r.hn:], p[:n])
		if r.hn == recordHeader {
			r.hn, r.rest = 0, int(r.hdr[3])<<8|int(r.hdr[4])
		}
	}
	return n, err
}

func newRecordConn(nc net.Conn) *recordConn {
	return &recordConn{Conn: nc, in: aheadBuf{pool: &recordPool}}
}

// newTLSIdleConn returns tc, a client over rec, as a connection that can
// wait for its socket and park, or tc itself where that cannot be done.
func newTLSIdleConn(tc *tls.Conn, rec *recordConn) net.Conn {
	tcp, ok := rec.Conn.(*net.TCPConn)
	if !ok || !canWaitReadable {
		return tc
	}
	rc, err := tcp.SyscallConn()
	if err != nil {
		return tc
	}
	return newIdle(tc, rc, &tlsReadPool, maxPlaintext, rec)
}
