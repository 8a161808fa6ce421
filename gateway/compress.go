package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"

	"github.com/shardfs/shardfs/wire"
)

// Compression is a transport compression the client asks the gateway for.
type Compression string

// The transport compressions of DESIGN.md section 3.
const (
	NoCompression Compression = ""
	// ZlibStream is Discord's compress=zlib-stream: one deflate context per
	// connection, each message ending in a sync flush (00 00 ff ff).
	ZlibStream Compression = "zlib-stream"
	// ZstdStream is compress=zstd-stream: one zstd stream per connection.
	// On Fluxer it is sent with stream=1, and client payloads go through a
	// zstd stream too.
	ZstdStream Compression = "zstd-stream"
)

// ParseCompression reads "none", "zlib-stream" or "zstd-stream".
func ParseCompression(s string) (Compression, error) {
	switch s {
	case "", "none":
		return NoCompression, nil
	case "zlib-stream":
		return ZlibStream, nil
	case "zstd-stream":
		return ZstdStream, nil
	}
	return "", fmt.Errorf("gateway: unknown compression %q; usage: none | zlib-stream | zstd-stream", s)
}

// MaxMessage bounds one message from the gateway, compressed or
// decompressed: a larger one is refused as a transient failure, so that a
// broken or hostile stream cannot exhaust memory.
const MaxMessage = 10 << 20

var (
	errTooLarge     = fmt.Errorf("message exceeds the %d MiB limit", MaxMessage>>20)
	errTruncated    = errors.New("compressed message ended inside a payload")
	errTextInStream = errors.New("text message inside a compressed stream")
	errZlibHeader   = errors.New("zlib-stream: invalid zlib header")
)

// messageSource yields the messages of one connection: a reader for each,
// and whether it was a binary message. A reader is valid until the next
// call.
type messageSource func() (r io.Reader, binary bool, err error)

// feed serves a connection's compressed messages to a decompressor as one
// byte stream. It fetches the next message only when the decompressor asks
// for more input than the current one holds, which decompressors do only
// once they have returned everything decoded so far; so a fetch while a
// payload is still incomplete means the payload was cut short, unless
// (zlib-stream) the previous message did not end with the sync flush
// suffix, in which case Discord's rule is to keep buffering.
type feed struct {
	src     messageSource
	zlib    bool
	cur     io.Reader
	size    int64   // bytes of the current message so far
	tail    [4]byte // its last bytes, for the zlib suffix
	tailN   int
	partial bool // set by the reader: a payload has started but not ended
	err     error
}

func (f *feed) Read(p []byte) (int, error) {
	for {
		if f.err != nil {
			return 0, f.err
		}
		if f.cur != nil {
			n, err := f.cur.Read(p)
			if n > 0 {
				f.size += int64(n)
				if f.size > MaxMessage {
					f.err = errTooLarge
					return 0, f.err
				}
				f.track(p[:n])
				return n, nil
			}
			if err == io.EOF {
				f.cur = nil
				continue
			}
			if err != nil {
				f.err = err
				return 0, err
			}
			continue
		}
		if f.partial && (!f.zlib || f.suffix()) {
			f.err = errTruncated
			return 0, f.err
		}
		r, binary, err := f.src()
		if err != nil {
			f.err = err
			return 0, err
		}
		if !binary {
			f.err = errTextInStream
			return 0, f.err
		}
		f.cur, f.size, f.tailN = r, 0, 0
	}
}

func (f *feed) track(b []byte) {
	if len(b) >= 4 {
		copy(f.tail[:], b[len(b)-4:])
		f.tailN = 4
		return
	}
	for _, c := range b {
		copy(f.tail[:], f.tail[1:])
		f.tail[3] = c
		f.tailN = min(f.tailN+1, 4)
	}
}

// suffix reports whether the last message ended with the zlib sync flush.
func (f *feed) suffix() bool {
	return f.tailN == 4 && f.tail == [4]byte{0, 0, 0xff, 0xff}
}

// inflater turns a connection's compressed messages back into payloads.
// It exists only on connections that negotiated compression: its state (a
// 32 KiB deflate window, or a zstd window) is the price of compression.
type inflater struct {
	feed    feed
	r       io.Reader // flate or zstd output
	zd      *zstd.Decoder
	scratch [512]byte // holds the first bytes of a payload while no buffer is taken
	carry   []byte    // decoded bytes past the end of the previous payload
}

// newInflater starts decompressing a connection whose first binary message
// is first; later messages come from src.
func newInflater(c Compression, first io.Reader, src messageSource) (*inflater, error) {
	z := &inflater{feed: feed{src: src, zlib: c == ZlibStream, cur: first}}
	switch c {
	case ZlibStream:
		// The zlib header is read here, and the deflate stream without
		// zlib's reader, which would checksum every byte of a stream that
		// never ends.
		var hdr [2]byte
		if _, err := io.ReadFull(&z.feed, hdr[:]); err != nil {
			return nil, err
		}
		if hdr[0]&0x0f != 8 || hdr[0]>>4 > 7 || (uint16(hdr[0])<<8|uint16(hdr[1]))%31 != 0 || hdr[1]&0x20 != 0 {
			return nil, errZlibHeader
		}
		// flate reads a *bufio.Reader byte by byte on its fast path and
		// never past what it needs, so it never reads into a message the
		// gateway has not sent yet.
		z.r = flate.NewReader(bufio.NewReaderSize(&z.feed, 512))
	case ZstdStream:
		zd, err := zstd.NewReader(&z.feed,
			zstd.WithDecoderConcurrency(1), // synchronous: no goroutines
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(8<<20),
		)
		if err != nil {
			return nil, err
		}
		z.zd, z.r = zd, zd
	default:
		return nil, fmt.Errorf("gateway: no decompressor for %q", c)
	}
	return z, nil
}

func (z *inflater) close() {
	if z.zd != nil {
		z.zd.Close()
	}
}

// next decodes the next payload into a buffer taken from the pool only
// once its first bytes arrive, so that an idle connection blocked here
// holds none. The caller returns the buffer with putBuf.
func (z *inflater) next() (payload []byte, buf *[]byte, err error) {
	var end objectEnd
	var b []byte
	take := func(chunk []byte) (bool, error) {
		k, done, err := end.scan(chunk)
		if err != nil {
			return false, err
		}
		if buf == nil {
			buf = getBuf()
			b = (*buf)[:0]
		}
		b = append(b, chunk[:k]...)
		if len(b) > MaxMessage {
			return false, errTooLarge
		}
		if done {
			z.carry = append(z.carry[:0], chunk[k:]...)
		}
		return done, nil
	}
	fail := func(err error) ([]byte, *[]byte, error) {
		if buf != nil {
			*buf = b
			putBuf(buf)
		}
		return nil, nil, err
	}
	if len(z.carry) > 0 {
		carry := z.carry
		z.carry = nil
		done, err := take(carry)
		if err != nil {
			return fail(err)
		}
		if done {
			*buf = b
			return b, buf, nil
		}
	}
	for {
		z.feed.partial = end.started
		var n int
		var rerr error
		if buf == nil {
			n, rerr = z.r.Read(z.scratch[:])
			if n > 0 {
				done, err := take(z.scratch[:n])
				if err != nil {
					return fail(err)
				}
				if done {
					*buf = b
					return b, buf, nil
				}
			}
		} else {
			if len(b) == cap(b) {
				b = slices.Grow(b, len(b))
			}
			n, rerr = z.r.Read(b[len(b):cap(b)])
			if n > 0 {
				fresh := b[len(b) : len(b)+n]
				k, done, err := end.scan(fresh)
				if err != nil {
					return fail(err)
				}
				if done {
					n = k
				}
				b = b[:len(b)+n]
				if len(b) > MaxMessage {
					return fail(errTooLarge)
				}
				if done {
					z.carry = append(z.carry[:0], fresh[k:]...)
					*buf = b
					return b, buf, nil
				}
			}
		}
		if rerr != nil {
			if z.feed.err != nil {
				rerr = z.feed.err // the network's or the framing's error, not the decoder's echo of it
			} else if rerr == io.EOF || errors.Is(rerr, io.ErrUnexpectedEOF) {
				rerr = fmt.Errorf("%s: stream ended", z.kind())
			} else {
				rerr = fmt.Errorf("%s: %w", z.kind(), rerr)
			}
			return fail(rerr)
		}
	}
}

func (z *inflater) kind() string {
	if z.feed.zlib {
		return "zlib-stream"
	}
	return "zstd-stream"
}

// objectEnd finds where a JSON object ends in a stream of chunks by
// counting brackets outside strings. It does not validate: parsePayload
// does that once the object is whole.
type objectEnd struct {
	depth   int
	started bool
	inStr   bool
	esc     bool
}

func (e *objectEnd) scan(c []byte) (int, bool, error) {
	for i := 0; i < len(c); i++ {
		if e.inStr {
			if e.esc {
				e.esc = false
				continue
			}
			for i < len(c) && strSafe[c[i]] {
				i++
			}
			if i == len(c) {
				break
			}
			switch c[i] {
			case '\\':
				e.esc = true
			case '"':
				e.inStr = false
			}
			continue
		}
		switch ch := c[i]; ch {
		case ' ', '\t', '\n', '\r':
		case '{', '[':
			if !e.started {
				if ch != '{' {
					return 0, false, wire.ErrNotObject
				}
				e.started = true
			}
			e.depth++
			if e.depth > wire.MaxDepth {
				return 0, false, wire.SyntaxError("nesting too deep", i)
			}
		case '}', ']':
			if !e.started {
				return 0, false, wire.ErrNotObject
			}
			e.depth--
			if e.depth == 0 {
				return i + 1, true, nil
			}
		case '"':
			if !e.started {
				return 0, false, wire.ErrNotObject
			}
			e.inStr = true
		default:
			if !e.started {
				return 0, false, wire.ErrNotObject
			}
		}
	}
	return len(c), false, nil
}

// zstdRawHeader starts the zstd stream a Fluxer client sends with
// compress=zstd-stream&stream=1: the magic number, a frame header with no
// content size, no checksum and no dictionary, and an 8 KiB window, which
// holds any client payload (at most 4,096 bytes).
var zstdRawHeader = []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x18}

// zstdRawBlock returns the header of a raw (stored) zstd block of n bytes
// that is not the frame's last: the frame lasts as long as the connection.
// Client payloads are a few heartbeats and commands a minute; storing them
// keeps the stream valid for the server's decompressor while the client
// keeps no encoder state (an encoder's tables are hundreds of KiB per
// connection).
func zstdRawBlock(n int) [3]byte {
	h := uint32(n) << 3 // Last_Block 0, Block_Type 0 (raw)
	return [3]byte{byte(h), byte(h >> 8), byte(h >> 16)}
}
