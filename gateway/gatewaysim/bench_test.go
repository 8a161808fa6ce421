package gatewaysim

import (
	"compress/zlib"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"
)

// streamFeed serves a connection's messages to a streaming decompressor,
// reading the next message only when asked for more bytes; the benchmark
// client cannot afford testClient's decompression from the start.
type streamFeed struct {
	ws  *websocket.Conn
	cur []byte
}

func (f *streamFeed) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		_ = f.ws.SetReadDeadline(time.Now().Add(netWait))
		_, msg, err := f.ws.ReadMessage()
		if err != nil {
			return 0, err
		}
		f.cur = msg
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// ReadByte keeps compress/flate from reading ahead through a bufio.Reader
// into messages that have not been sent.
func (f *streamFeed) ReadByte() (byte, error) {
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// BenchmarkFlood measures the events per second the simulator pushes to one
// connection, the client reading each payload (and decompressing it) but
// not decoding its JSON beyond finding where it ends.
func BenchmarkFlood(b *testing.B) {
	for _, compress := range []string{"", "zlib-stream", "zstd-stream"} {
		name := compress
		if name == "" {
			name = "json"
		}
		b.Run(name, func(b *testing.B) {
			srv, err := New(Config{HeartbeatInterval: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			c := dial(b, srv, "compress="+compress)
			var dec *json.Decoder
			if compress == "" {
				c.start(srv, 0, 1)
			} else {
				feed := &streamFeed{ws: c.ws}
				var r io.ReadCloser
				if compress == "zlib-stream" {
					r, err = zlib.NewReader(feed)
				} else {
					var zr *zstd.Decoder
					zr, err = zstd.NewReader(feed, zstd.WithDecoderConcurrency(1))
					r = zr.IOReadCloser()
				}
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				dec = json.NewDecoder(r)
				var f gwFrame
				for _, want := range []int{opHello, opDispatch, opDispatch} {
					if want == opDispatch && f.Op == opHello {
						c.identify(identifyOpts{intents: IntentGuilds})
					}
					if err := dec.Decode(&f); err != nil || f.Op != want {
						b.Fatalf("handshake: op %d, %v; want op %d", f.Op, err, want)
					}
				}
			}
			b.ResetTimer()
			srv.Flood(0, b.N)
			var raw json.RawMessage
			for range b.N {
				if dec != nil {
					if err := dec.Decode(&raw); err != nil {
						b.Fatal(err)
					}
					continue
				}
				_ = c.ws.SetReadDeadline(time.Now().Add(netWait))
				_, r, err := c.ws.NextReader()
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, r)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
