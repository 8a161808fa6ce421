package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"
)

// newZstdStream makes the encoder of a connection's compress=zstd-stream:
// one frame that never ends, each message flushed blocks of it, as both
// gateways send it. Small window and no concurrency: one per client.
func newZstdStream(w io.Writer) *zstd.Encoder {
	e, err := zstd.NewWriter(w, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithWindowSize(1<<17), zstd.WithLowerEncoderMem(true))
	if err != nil {
		panic(err) // fixed, valid options
	}
	return e
}

var errTextInStream = errors.New("text message inside a compressed stream")

// zstdReader reads a client's payloads from Fluxer's stream=1: the
// client's messages are one zstd stream, whose decompressed bytes are the
// payloads one after another. A JSON decoder cuts them apart, so a
// payload split across messages, or two in one, reads the same.
type zstdReader struct {
	feed messageFeed
	dec  *zstd.Decoder
	js   *json.Decoder
	read int64 // decompressed bytes handed to js
}

// messageFeed is the connection's binary messages as one byte stream.
type messageFeed struct {
	ws  *websocket.Conn
	cur io.Reader
	err error // the connection's own error, which ends the stream
}

func (f *messageFeed) Read(p []byte) (int, error) {
	for {
		if f.err != nil {
			return 0, f.err
		}
		if f.cur == nil {
			typ, r, err := f.ws.NextReader()
			if err == nil && typ != websocket.BinaryMessage {
				err = errTextInStream
			}
			if err != nil {
				f.err = err
				return 0, err
			}
			f.cur = r
		}
		n, err := f.cur.Read(p)
		if err == io.EOF {
			f.cur = nil
			err = nil
		}
		if n > 0 || err != nil {
			if err != nil {
				f.err = err
			}
			return n, err
		}
	}
}

// Read hands the decoder's output to the JSON decoder, refusing to run
// more than a payload's limit ahead of the last payload's end: a client
// cannot make the relay buffer without bound.
func (z *zstdReader) Read(p []byte) (int, error) {
	if z.read-z.js.InputOffset() > 2*maxPayload {
		return 0, errTooLarge
	}
	n, err := z.dec.Read(p)
	z.read += int64(n)
	return n, err
}

// next returns the client's next payload.
func (z *zstdReader) next(ws *websocket.Conn) ([]byte, error) {
	if z.dec == nil {
		z.feed.ws = ws
		// 8 MiB: the window zstd's format asks every decoder to take,
		// and what a default encoder declares.
		dec, err := zstd.NewReader(&z.feed, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderMaxMemory(64<<20))
		if err != nil {
			return nil, z.fail(err)
		}
		z.dec = dec
		z.js = json.NewDecoder(z)
	}
	var raw json.RawMessage
	if err := z.js.Decode(&raw); err != nil {
		return nil, z.fail(err)
	}
	if len(raw) > maxPayload {
		return nil, errTooLarge
	}
	return bytes.Clone(raw), nil
}

// fail is the connection's own error when it ended the stream (a close,
// a timeout), else a payload that does not decode.
func (z *zstdReader) fail(err error) error {
	if z.feed.err != nil && !errors.Is(z.feed.err, errTextInStream) {
		return z.feed.err
	}
	if errors.Is(err, errTooLarge) {
		return err
	}
	return errUndecodable
}

var errUndecodable = errors.New("undecodable payload")

// close releases the decoder.
func (z *zstdReader) close() {
	if z.dec != nil {
		z.dec.Close()
	}
}
