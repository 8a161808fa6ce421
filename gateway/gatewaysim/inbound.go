package gatewaysim

import (
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

var (
	errTooLarge   = errors.New("payload too large")
	errDecompress = errors.New("decompression failed")
	// errStop ends a connection's reading after the server decided to close
	// it; the reader then only drains until the peer's close frame.
	errStop = errors.New("connection closing")
)

// messageSource yields the WebSocket messages of one connection, each at
// most MaxPayload bytes (a longer one is errTooLarge). A message stays valid
// until it is released.
type messageSource interface {
	next() ([]byte, error)
	release([]byte)
}

var messagePool = sync.Pool{New: func() any {
	b := make([]byte, MaxPayload+1)
	return &b
}}

// readPayloads decodes the client payloads of a connection and hands each
// one to handle, until handle or the source fails. With compressed set the
// messages are one zstd stream, as Fluxer's compress=zstd-stream&stream=1
// sends them: each message carries the blocks of exactly one payload.
func readPayloads(src messageSource, compressed bool, handle func([]byte) error) error {
	if compressed {
		return readZstdPayloads(src, handle)
	}
	for {
		msg, err := src.next()
		if err != nil {
			return err
		}
		err = handle(msg)
		src.release(msg)
		if err != nil {
			return err
		}
	}
}

// zstdFeed serves a connection's messages to a zstd decoder as one byte
// stream. The decoder only asks for more input once it has returned every
// byte it decoded (it reads exactly what it needs), so a request for input
// beyond the end of a message marks the end of that message's payload.
type zstdFeed struct {
	src      messageSource
	msg      []byte // current message, for release
	cur      []byte // its unread part
	inMsg    bool
	boundary func() error
	err      error // first failure of src or boundary
}

func (f *zstdFeed) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		if f.inMsg {
			f.inMsg = false
			f.src.release(f.msg)
			f.msg = nil
			if err := f.boundary(); err != nil {
				f.err = err
				return 0, err
			}
		}
		msg, err := f.src.next()
		if err != nil {
			f.err = err
			return 0, err
		}
		f.msg, f.cur, f.inMsg = msg, msg, true
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

func readZstdPayloads(src messageSource, handle func([]byte) error) error {
	var out []byte
	feed := &zstdFeed{src: src}
	feed.boundary = func() error {
		p := out
		out = out[:0]
		return handle(p)
	}
	dec, err := zstd.NewReader(feed,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(8<<20),
	)
	if err != nil {
		return errDecompress
	}
	defer dec.Close()
	var buf [1024]byte
	for {
		n, err := dec.Read(buf[:])
		out = append(out, buf[:n]...)
		if len(out) > MaxPayload {
			return errTooLarge
		}
		if err != nil {
			if feed.err != nil {
				return feed.err
			}
			return errDecompress
		}
	}
}

// wsSource reads messages from a gateway connection.
type wsSource struct {
	c *conn
}

func (w wsSource) next() ([]byte, error) {
	_, r, err := w.c.ws.NextReader()
	if err != nil {
		return nil, err
	}
	bp := messagePool.Get().(*[]byte)
	buf := (*bp)[:MaxPayload+1]
	n, err := io.ReadFull(r, buf)
	switch {
	case err == nil:
		messagePool.Put(bp)
		return nil, errTooLarge
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return buf[:n], nil
	default:
		messagePool.Put(bp)
		return nil, err
	}
}

func (w wsSource) release(b []byte) {
	if cap(b) == MaxPayload+1 {
		b = b[:cap(b)]
		messagePool.Put(&b)
	}
}
