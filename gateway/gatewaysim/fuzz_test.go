package gatewaysim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// sliceSource serves prepared messages the way wsSource serves a socket's.
type sliceSource struct{ msgs [][]byte }

func (s *sliceSource) next() ([]byte, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	if len(m) > MaxPayload {
		return nil, errTooLarge
	}
	return m, nil
}

func (s *sliceSource) release([]byte) {}

// frameMessages joins messages with 2-byte length prefixes, the fuzz
// input's format.
func frameMessages(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

func splitMessages(data []byte) [][]byte {
	var out [][]byte
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		n = min(n, len(data))
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

// zstdMessages compresses payloads as a Fluxer client with stream=1 does:
// one stream, flushed after each payload.
func zstdMessages(t testing.TB, payloads ...string) [][]byte {
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, p := range payloads {
		buf.Reset()
		enc.Write([]byte(p))
		enc.Flush()
		out = append(out, bytes.Clone(buf.Bytes()))
	}
	return out
}

// FuzzInbound feeds client messages, plain or as one zstd stream, through
// the server's payload decoding and command parsing.
func FuzzInbound(f *testing.F) {
	plain := []string{
		`{"op":1,"d":null}`,
		`{"op":2,"d":{"token":"Bot sim-token","intents":513,"shard":[0,1],"properties":{"os":"linux"}}}`,
		`{"op":6,"d":{"token":"sim-token","session_id":"abc","seq":12}}`,
		`{"op":1,"d":-1}`,
		`{"op":2,"d":{"shard":[1,0]}}`,
		`[{"op":1}]`,
	}
	for _, p := range plain {
		f.Add(frameMessages([]byte(p)), false)
	}
	f.Add(frameMessages(zstdMessages(f, plain...)...), true)
	f.Add(frameMessages(zstdMessages(f, `{"op":1,"d":7}`)[0], []byte{0xff, 0xff, 0xff}), true)
	whole, _ := zstd.NewWriter(nil)
	f.Add(frameMessages(whole.EncodeAll([]byte(plain[0]), nil), whole.EncodeAll([]byte(plain[1]), nil)), true)

	f.Fuzz(func(t *testing.T, data []byte, compressed bool) {
		msgs := splitMessages(data)
		var payloads [][]byte
		err := readPayloads(&sliceSource{msgs: msgs}, compressed, func(p []byte) error {
			if len(p) > MaxPayload {
				t.Fatalf("payload of %d bytes passed the %d-byte limit", len(p), MaxPayload)
			}
			payloads = append(payloads, bytes.Clone(p))
			checkCommand(t, p)
			return nil
		})
		if err == nil {
			t.Fatal("readPayloads returned nil; it only returns when reading fails")
		}
		if !compressed && errors.Is(err, io.EOF) {
			if len(payloads) != len(msgs) {
				t.Fatalf("%d payloads from %d messages", len(payloads), len(msgs))
			}
			for i := range msgs {
				if !bytes.Equal(payloads[i], msgs[i]) {
					t.Fatalf("payload %d = %q; want the message %q", i, payloads[i], msgs[i])
				}
			}
		}
	})
}

// checkCommand runs every parser a payload can reach and checks what each
// one promises.
func checkCommand(t *testing.T, p []byte) {
	cmd, err := parseCommand(p)
	if err != nil {
		return
	}
	if seq, ok := parseSeq(cmd.D); ok && seq < -1 {
		t.Fatalf("parseSeq(%s) = %d", cmd.D, seq)
	}
	var id identifyData
	if decodeObject(cmd.D, &id) == nil {
		if shardID, total, ok := parseShard(id.Shard); ok && (shardID < 0 || shardID >= total) {
			t.Fatalf("parseShard(%s) = %d, %d", id.Shard, shardID, total)
		}
		parseIntents(id.Intents)
		if tok, ok := parseToken(id.Token); ok && tok == "" {
			t.Fatalf("parseToken(%s) accepted an empty token", id.Token)
		}
	}
	var rd resumeData
	if decodeObject(cmd.D, &rd) == nil {
		parseSeq(rd.Seq)
	}
}

func TestReadZstdPayloads(t *testing.T) {
	payloads := []string{`{"op":2,"d":{}}`, `{"op":1,"d":3}`, ``, `{"op":1,"d":4}`}
	tests := []struct {
		name string
		msgs [][]byte
	}{
		{"one stream, flushed per payload", zstdMessages(t, payloads...)},
		{"one frame per payload", func() [][]byte {
			enc, _ := zstd.NewWriter(nil)
			var out [][]byte
			for _, p := range payloads {
				out = append(out, enc.EncodeAll([]byte(p), nil))
			}
			return out
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := readPayloads(&sliceSource{msgs: tt.msgs}, true, func(p []byte) error {
				got = append(got, string(p))
				return nil
			})
			if !errors.Is(err, io.EOF) {
				t.Fatalf("readPayloads = %v; want io.EOF at the end", err)
			}
			// The empty payload is a message of its own: the server closes
			// 4002 for it rather than merging it with the next.
			if len(got) != len(payloads) {
				t.Fatalf("got %q; want %q", got, payloads)
			}
			for i := range payloads {
				if got[i] != payloads[i] {
					t.Fatalf("got %q; want %q", got, payloads)
				}
			}
		})
	}
	t.Run("handle error stops reading", func(t *testing.T) {
		calls := 0
		err := readPayloads(&sliceSource{msgs: zstdMessages(t, payloads...)}, true, func([]byte) error {
			calls++
			return errStop
		})
		if !errors.Is(err, errStop) || calls != 1 {
			t.Fatalf("readPayloads = %v after %d calls; want errStop after 1", err, calls)
		}
	})
	t.Run("corrupt stream", func(t *testing.T) {
		msgs := append(zstdMessages(t, payloads[0]), []byte{0xff, 0xff, 0xff, 0xff})
		if err := readPayloads(&sliceSource{msgs: msgs}, true, func([]byte) error { return nil }); !errors.Is(err, errDecompress) {
			t.Fatalf("readPayloads = %v; want errDecompress", err)
		}
	})
}
