package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/wire"
)

func TestParsePayload(t *testing.T) {
	for _, tc := range []struct {
		in              string
		op              int
		seq             int64
		name, d         string
		wantErr         bool
		nameEscapedWant bool
	}{
		{in: `{"op":0,"s":42,"t":"MESSAGE_CREATE","d":{"a":[1,2,{"b":"}"}]}}`, op: 0, seq: 42, name: "MESSAGE_CREATE", d: `{"a":[1,2,{"b":"}"}]}`},
		{in: ` {"t":"READY","d":{},"s":1,"op":0} `, op: 0, seq: 1, name: "READY", d: `{}`},
		{in: `{"op":11}`, op: 11, seq: -1},
		{in: `{"op":11,"d":null,"s":null,"t":null}`, op: 11, seq: -1, d: `null`},
		{in: `{"op":9,"d":false}`, op: 9, seq: -1, d: `false`},
		{in: `{"op":10,"d":{"heartbeat_interval":41250},"extra":[true,null,-1.5e3]}`, op: 10, seq: -1, d: `{"heartbeat_interval":41250}`},
		{in: `{"\u006fp":7}`, op: 7, seq: -1},
		{in: `{"op":0,"s":3,"t":"A\u005fB","d":1}`, op: 0, seq: 3, name: `A\u005fB`, d: `1`, nameEscapedWant: true},
		// Several op keys, or one in another case, are a protocol error:
		// which one a reader takes is not something to guess.
		{in: `{"op":1,"op":2}`, wantErr: true},
		{in: `{"op":0,"Op":0}`, wantErr: true},
		{in: `{"OP":11}`, wantErr: true},
		{in: `{"op":11,"op":11}`, wantErr: true},
		{in: `{"op":0,"d":{"op":1,"Op":2}}`, op: 0, seq: -1, d: `{"op":1,"Op":2}`},
		{in: `{"op":"0"}`, wantErr: true},
		{in: `{"op":1.0}`, wantErr: true},
		{in: `{"op":99999999999}`, wantErr: true},
		{in: `{"s":1}`, wantErr: true},
		{in: `{"op":0,"s":-1}`, wantErr: true},
		{in: `{"op":0,"t":5}`, wantErr: true},
		{in: `{"op":0,"s":`, wantErr: true},
		{in: `{"op":0}x`, wantErr: true},
		{in: `[{"op":0}]`, wantErr: true},
		{in: `{"op":0,"d":"\x01"}`, wantErr: true},
		{in: `{"op":0,"d":[1,]}`, wantErr: true},
		{in: `{"op":0,"d":{"a":1,}}`, wantErr: true},
		{in: `{"op":0,"d":01}`, wantErr: true},
		{in: `{"op":0,"d":"\x"}`, wantErr: true},
		{in: `{"op":0,"d":tru}`, wantErr: true},
		{in: strings.Repeat("[", 20000), wantErr: true},
		{in: `{"op":0,"d":` + strings.Repeat("[", wire.MaxDepth+1) + strings.Repeat("]", wire.MaxDepth+1) + `}`, wantErr: true},
		{in: ``, wantErr: true},
	} {
		p, err := parsePayload([]byte(tc.in))
		if tc.wantErr {
			if err == nil {
				t.Errorf("parsePayload(%.60q) = op %d, no error; want an error", tc.in, p.op)
			}
			continue
		}
		if err != nil {
			t.Errorf("parsePayload(%.60q) = %v", tc.in, err)
			continue
		}
		if p.op != tc.op || p.seq != tc.seq || string(p.name) != tc.name || string(p.d) != tc.d || p.nameEscaped != tc.nameEscapedWant {
			t.Errorf("parsePayload(%q) = op %d s %d t %q d %q esc %v; want %d %d %q %q %v", tc.in, p.op, p.seq, p.name, p.d, p.nameEscaped, tc.op, tc.seq, tc.name, tc.d, tc.nameEscapedWant)
		}
	}
}

func TestReadyFields(t *testing.T) {
	d := []byte(`{"v":10,"user":{"session_id":"not this one"},"session_id":"abc\/123","resume_gateway_url":"wss://resume.example/"}`)
	sid, url := readyFields(d)
	if sid != "abc/123" || url != "wss://resume.example/" {
		t.Errorf("readyFields() = %q, %q; want abc/123, wss://resume.example/", sid, url)
	}
	red := redactReady(d)
	if !json.Valid(red) || bytes.Contains(red, []byte("abc")) || !bytes.Contains(red, []byte(`"session_id":"redacted"`)) || !bytes.Contains(red, []byte("not this one")) {
		t.Errorf("redactReady() = %s", red)
	}
	twice := []byte(`{"session_id":"first-secret","v":10,"session_id":"second-secret"}`)
	if red := redactReady(twice); !json.Valid(red) || bytes.Contains(red, []byte("secret")) || bytes.Count(red, []byte(`"redacted"`)) != 2 {
		t.Errorf("redactReady(two session_id keys) = %s; want both redacted", red)
	}
	if ms, err := helloInterval([]byte(`{"heartbeat_interval":41250}`)); ms != 41250 || err != nil {
		t.Errorf("helloInterval() = %d, %v; want 41250", ms, err)
	}
	for _, bad := range []string{`{}`, `{"heartbeat_interval":0}`, `{"heartbeat_interval":"1"}`, `{"heartbeat_interval":1.5}`, `{"heartbeat_interval":99999999}`} {
		if _, err := helloInterval([]byte(bad)); err == nil {
			t.Errorf("helloInterval(%s) = nil error", bad)
		}
	}
}

func TestClassifyClose(t *testing.T) {
	for code, want := range map[int][2]core.FailureClass{
		4000: {core.Transient, core.Transient}, 4001: {core.Transient, core.Transient},
		4002: {core.Transient, core.Transient}, 4003: {core.Transient, core.Transient},
		4004: {core.FatalFailure, core.FatalFailure}, 4005: {core.Transient, core.Transient},
		4007: {core.NewSession, core.NewSession}, 4008: {core.Transient, core.Transient},
		4009: {core.NewSession, core.NewSession}, 4010: {core.FatalFailure, core.FatalFailure},
		4011: {core.FatalFailure, core.FatalFailure}, 4012: {core.FatalFailure, core.FatalFailure},
		4013: {core.FatalFailure, core.Transient}, 4014: {core.FatalFailure, core.Transient},
		1000: {core.NewSession, core.NewSession}, 1001: {core.NewSession, core.NewSession},
		1005: {core.Transient, core.Transient}, 1006: {core.Transient, core.Transient},
		4999: {core.Transient, core.Transient},
	} {
		if got := ClassifyClose(core.Discord, code); got != want[0] {
			t.Errorf("ClassifyClose(discord, %d) = %v; want %v", code, got, want[0])
		}
		if got := ClassifyClose(core.Fluxer, code); got != want[1] {
			t.Errorf("ClassifyClose(fluxer, %d) = %v; want %v", code, got, want[1])
		}
	}
}

// TestZstdRawStream decodes what the client sends on Fluxer's stream=1
// with an independent decoder: one stream, one payload per message.
func TestZstdRawStream(t *testing.T) {
	payloads := []string{`{"op":1,"d":null}`, `{"op":2,"d":{"token":"x"}}`, strings.Repeat("y", 4096)}
	var stream []byte
	stream = append(stream, zstdRawHeader...)
	for _, p := range payloads {
		h := zstdRawBlock(len(p))
		stream = append(stream, h[:]...)
		stream = append(stream, p...)
	}
	d, err := zstd.NewReader(io.MultiReader(bytes.NewReader(stream)), zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	out, err := io.ReadAll(d)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("decoding the client's zstd stream: %v", err)
	}
	if want := strings.Join(payloads, ""); string(out) != want {
		t.Errorf("decoded %d bytes; want %d", len(out), len(want))
	}
}

// compressMessages turns payloads into a connection's compressed
// messages, one per payload, as the gateways send them.
func compressMessages(t testing.TB, c Compression, payloads [][]byte) [][]byte {
	var buf bytes.Buffer
	var msgs [][]byte
	switch c {
	case ZlibStream:
		w, _ := zlib.NewWriterLevel(&buf, zlib.BestSpeed)
		for _, p := range payloads {
			w.Write(p)
			w.Flush() // sync flush: ends in 00 00 ff ff
			msgs = append(msgs, bytes.Clone(buf.Bytes()))
			buf.Reset()
		}
	case ZstdStream:
		w, _ := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<17))
		for _, p := range payloads {
			w.Write(p)
			w.Flush() // ends the block, not the frame
			msgs = append(msgs, bytes.Clone(buf.Bytes()))
			buf.Reset()
		}
	}
	return msgs
}

// inflateAll runs the client's decompression over messages and returns
// the payloads it produced and the error that stopped it. It never reads
// past the messages: running out is an error like any other.
func inflateAll(c Compression, msgs [][]byte) ([][]byte, error) {
	if len(msgs) == 0 {
		return nil, io.EOF
	}
	rest := msgs[1:]
	src := func() (io.Reader, bool, error) {
		if len(rest) == 0 {
			return nil, false, io.EOF
		}
		m := rest[0]
		rest = rest[1:]
		return bytes.NewReader(m), true, nil
	}
	z, err := newInflater(c, bytes.NewReader(msgs[0]), src)
	if err != nil {
		return nil, err
	}
	defer z.close()
	var out [][]byte
	for {
		p, buf, err := z.next()
		if err != nil {
			return out, err
		}
		if len(p) > MaxMessage {
			return out, errors.New("payload over the limit came through")
		}
		out = append(out, bytes.Clone(p))
		putBuf(buf)
	}
}

func TestInflate(t *testing.T) {
	payloads := [][]byte{
		[]byte(`{"op":10,"d":{"heartbeat_interval":41250}}`),
		[]byte(`{"op":0,"s":1,"t":"READY","d":{"x":"` + strings.Repeat(`ab\"c\\`, 30000) + `"}}`),
		[]byte(`{"op":11}`),
		[]byte(` {"op":0,"s":2,"t":"X","d":[]} `),
	}
	for _, c := range []Compression{ZlibStream, ZstdStream} {
		t.Run(string(c), func(t *testing.T) {
			msgs := compressMessages(t, c, payloads)
			out, err := inflateAll(c, msgs)
			if err != io.EOF {
				t.Errorf("inflate stopped with %v; want io.EOF after the last message", err)
			}
			if len(out) != len(payloads) {
				t.Fatalf("got %d payloads; want %d", len(out), len(payloads))
			}
			for i := range out {
				if want := bytes.TrimSpace(payloads[i]); !bytes.Equal(bytes.TrimSpace(out[i]), want) {
					t.Errorf("payload %d = %.40q; want %.40q", i, out[i], want)
				}
			}
			// A payload cut short inside its message is an error, not a
			// wait for the next message.
			msgs = compressMessages(t, c, [][]byte{[]byte(`{"op":0,"s":`), []byte(`{"op":11}`)})
			if _, err := inflateAll(c, msgs); !errors.Is(err, errTruncated) {
				t.Errorf("truncated payload: %v; want errTruncated", err)
			}
		})
	}
	// zlib-stream: a message without the sync flush suffix continues in
	// the next one, as Discord's docs say to buffer until the suffix.
	msgs := compressMessages(t, ZlibStream, payloads)
	big := msgs[1]
	split := append([][]byte{msgs[0], big[:len(big)/2], big[len(big)/2:]}, msgs[2:]...)
	if out, err := inflateAll(ZlibStream, split); err != io.EOF || len(out) != len(payloads) {
		t.Errorf("split message: %d payloads, %v; want %d, io.EOF", len(out), err, len(payloads))
	}
}

func TestInflateLimit(t *testing.T) {
	for _, c := range []Compression{ZlibStream, ZstdStream} {
		for _, size := range []int{MaxMessage - 100, MaxMessage + 1} {
			p := append([]byte(`{"op":0,"d":"`), bytes.Repeat([]byte("a"), size-len(`{"op":0,"d":""}`))...)
			p = append(p, `"}`...)
			msgs := compressMessages(t, c, [][]byte{p})
			out, err := inflateAll(c, msgs)
			if size > MaxMessage && !errors.Is(err, errTooLarge) {
				t.Errorf("%s: %d bytes decompressed: %v; want errTooLarge", c, size, err)
			}
			if size <= MaxMessage && (len(out) != 1 || len(out[0]) != size) {
				t.Errorf("%s: %d bytes decompressed: %d payloads, %v; want the payload", c, size, len(out), err)
			}
		}
	}
}

// FuzzParsePayload checks the envelope decoder against encoding/json: the
// same messages are accepted, and op, s, t and d agree.
func FuzzParsePayload(f *testing.F) {
	for _, s := range []string{
		`{"op":0,"s":42,"t":"MESSAGE_CREATE","d":{"a":[1,2,{"b":"}"}]}}`,
		`{"op":11}`, `{"op":10,"d":{"heartbeat_interval":41250}}`, `{"op":9,"d":false}`,
		`{"t":null,"s":null,"op":1,"d":null}`, `{"op":0,"d":"\ud83d\ude00 \u0000"}`,
		`{"op":0,"d":[1e5,-0.5,true,false,null,{},[]]}`, `{"op":"1"}`, `{"op":0,"s":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePayload(b)
		var ref map[string]json.RawMessage
		refErr := json.Unmarshal(b, &ref)
		if refErr == nil {
			// encoding/json takes any JSON object; the envelope also needs
			// an integer op, a non-negative integer or null s, and a string
			// or null t.
			var op int32
			if raw, ok := ref["op"]; !ok || string(raw) == "null" || json.Unmarshal(raw, &op) != nil || bytes.ContainsAny(raw, ".eE") {
				refErr = wire.ErrNoOp
			} else if raw, ok := ref["s"]; ok && string(raw) != "null" {
				var s int64
				if json.Unmarshal(raw, &s) != nil || s < 0 || bytes.ContainsAny(raw, ".eE") {
					refErr = wire.ErrSyntax
				}
			}
			if raw, ok := ref["t"]; ok && string(raw) != "null" {
				var s string
				if json.Unmarshal(raw, &s) != nil {
					refErr = wire.ErrSyntax
				}
			}
		}
		if refErr == nil && ambiguousOp(b) {
			refErr = wire.ErrAmbiguousOp
		}
		if (err == nil) != (refErr == nil) {
			t.Fatalf("parsePayload(%q) = %v; encoding/json says %v", b, err, refErr)
		}
		if err != nil {
			return
		}
		var op int
		json.Unmarshal(ref["op"], &op)
		if p.op != op {
			t.Fatalf("op = %d; encoding/json says %d", p.op, op)
		}
		if raw, ok := ref["d"]; ok && !bytes.Equal(bytes.ToValidUTF8(bytes.TrimSpace(raw), replacement), p.d) {
			t.Fatalf("d = %q; encoding/json says %q", p.d, raw)
		}
		if raw, ok := ref["t"]; ok && string(raw) != "null" && utf8.Valid(raw) {
			var s string
			json.Unmarshal(raw, &s)
			got := string(p.name)
			if p.nameEscaped {
				got, _ = wire.String(raw)
			}
			if got != s {
				t.Fatalf("t = %q; encoding/json says %q", got, s)
			}
		}
	})
}

// ambiguousOp reports, with encoding/json's tokenizer, whether the object
// b has more than one key "op" or one that differs from it only in case.
func ambiguousOp(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return false
	}
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return false
		}
		if k, _ := tok.(string); strings.EqualFold(k, "op") {
			if k != "op" {
				return true
			}
			n++
		}
	}
	return n > 1
}

// splitMessages reads fuzz input as messages, each a one-byte length
// (times 16) followed by that many bytes.
func splitMessages(data []byte) [][]byte {
	var msgs [][]byte
	for len(data) > 0 {
		n := min(int(data[0])*16+1, len(data)-1)
		msgs = append(msgs, data[1:1+n])
		data = data[1+n:]
	}
	return msgs
}

func joinMessages(msgs [][]byte) []byte {
	var out []byte
	for _, m := range msgs {
		for len(m) > 0 {
			n := min(len(m), 255*16+1)
			out = append(out, byte((n-1)/16))
			k := (n-1)/16*16 + 1
			out = append(out, m[:k]...)
			m = m[k:]
		}
	}
	return out
}

func fuzzInflate(f *testing.F, c Compression) {
	for _, ps := range [][]string{
		{`{"op":10,"d":{"heartbeat_interval":41250}}`, `{"op":0,"s":1,"t":"READY","d":{"session_id":"x"}}`},
		{`{"op":11}`, `{"op":0,"s":`, `{"op":1}`},
		{`{"op":0,"d":"` + strings.Repeat("z", 5000) + `"}`},
	} {
		var payloads [][]byte
		for _, p := range ps {
			payloads = append(payloads, []byte(p))
		}
		f.Add(joinMessages(compressMessages(f, c, payloads)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := inflateAll(c, splitMessages(data))
		if err == nil {
			t.Fatalf("inflate ended without an error")
		}
		for _, p := range out {
			if len(p) > MaxMessage {
				t.Fatalf("a %d-byte payload passed the limit", len(p))
			}
		}
	})
}

// FuzzZlibStream feeds arbitrary zlib-stream messages to the client's
// decompression: it must fail cleanly, never panic or pass the limit.
func FuzzZlibStream(f *testing.F) { fuzzInflate(f, ZlibStream) }

// FuzzZstdStream does the same for zstd-stream.
func FuzzZstdStream(f *testing.F) { fuzzInflate(f, ZstdStream) }
