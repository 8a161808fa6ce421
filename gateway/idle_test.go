package gateway

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"
)

// serverFrame builds one unmasked server-to-client frame.
func serverFrame(op byte, fin bool, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, byte(n))
	case n < 1<<16:
		out = append(out, 126, byte(n>>8), byte(n))
	default:
		out = append(out, 127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(out, payload...)
}

// TestFrameTracker feeds random frame streams, cut at random points, and
// checks that the tracker counts the messages and knows when a stream
// ends exactly at the end of one.
func TestFrameTracker(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		stream := []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
		var messages int64
		quietAtEnd := true // nothing after the HTTP response yet
		for range rng.IntN(8) {
			switch rng.IntN(4) {
			case 0: // a control frame: ping, pong or close
				stream = append(stream, serverFrame([]byte{9, 10, 8}[rng.IntN(3)], true, bytes.Repeat([]byte("p"), rng.IntN(126)))...)
				quietAtEnd = false
			case 1: // a fragmented message
				stream = append(stream, serverFrame(1, false, bytes.Repeat([]byte("a"), rng.IntN(300)))...)
				stream = append(stream, serverFrame(0, false, nil)...)
				stream = append(stream, serverFrame(0, true, bytes.Repeat([]byte("b"), rng.IntN(70000)))...)
				messages++
				quietAtEnd = true
			default:
				size := []int{0, 5, 125, 126, 700, 65535, 65536, 100000}[rng.IntN(8)]
				stream = append(stream, serverFrame(byte(1+rng.IntN(2)), true, bytes.Repeat([]byte("m"), size))...)
				messages++
				quietAtEnd = true
			}
		}
		// Half the rounds stop in the middle of the next frame.
		partial := rng.IntN(2) == 0
		if partial {
			f := serverFrame(1, true, bytes.Repeat([]byte("x"), 300))
			stream = append(stream, f[:1+rng.IntN(len(f)-1)]...)
		}
		var tr frameTracker
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(2000))
			tr.feed(rest[:n])
			rest = rest[n:]
		}
		if tr.messages != messages {
			t.Fatalf("round %d: messages = %d; want %d", round, tr.messages, messages)
		}
		want := quietAtEnd && !partial
		if got := tr.quiet(messages); got != want {
			t.Fatalf("round %d: quiet = %v; want %v (partial %v)", round, got, want, partial)
		}
		if tr.quiet(messages - 1) {
			t.Fatalf("round %d: quiet with a message unread", round)
		}
	}
}

// Configured to read ahead (as over crypto/tls), idleConn reads into a
// pooled buffer for gorilla's small reads, hands the bytes over in order,
// and holds no buffer once they are taken.
func TestIdleConnReadAhead(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	c := &idleConn{Conn: client, fd: -1, in: aheadBuf{pool: &readPool}, size: readAhead}
	stream := []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n")
	for i := range 20 {
		stream = append(stream, serverFrame(1, true, bytes.Repeat([]byte{byte('a' + i)}, 50+37*i))...)
	}
	go func() {
		server.Write(stream)
		server.Close()
	}()
	var got []byte
	for {
		p := make([]byte, 1+len(got)%125)
		n, err := c.Read(p)
		got = append(got, p[:n]...)
		if err != nil {
			if err != io.EOF {
				t.Fatalf("Read: %v", err)
			}
			break
		}
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("read %d bytes that differ from the %d sent", len(got), len(stream))
	}
	if c.buffered() || c.in.b != nil {
		t.Error("a buffer is held after every byte was taken")
	}
	if c.t.messages != 20 || !c.t.quiet(20) {
		t.Errorf("tracker saw %d messages, quiet=%v; want 20 and quiet", c.t.messages, c.t.quiet(20))
	}
}

// recordConn hands crypto/tls the bytes of the socket in order, never past
// the end of the current record's header or body, and holds no buffer once
// they are taken.
func TestRecordConnStopsAtRecords(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	var stream []byte
	var bounds []int // offsets where a header or a body ends
	for range 200 {
		n := rnd.IntN(maxPlaintext + 300)
		if rnd.IntN(8) == 0 {
			n = rnd.IntN(3) // empty and tiny records too
		}
		stream = append(stream, 23, 3, 3, byte(n>>8), byte(n))
		bounds = append(bounds, len(stream))
		for range n {
			stream = append(stream, byte(rnd.Uint32()))
		}
		bounds = append(bounds, len(stream))
	}
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		wrnd := rand.New(rand.NewPCG(5, 6)) // rnd is the reader's
		rest := stream
		for len(rest) > 0 {
			k := min(len(rest), 1+wrnd.IntN(40000))
			server.Write(rest[:k])
			rest = rest[k:]
		}
		server.Close()
	}()
	r := newRecordConn(client)
	var got []byte
	next := 0 // index into bounds of the next boundary
	for {
		p := make([]byte, 1+rnd.IntN(20000))
		n, err := r.Read(p)
		if n > 0 {
			for next < len(bounds) && bounds[next] <= len(got) {
				next++
			}
			if next < len(bounds) && len(got)+n > bounds[next] {
				t.Fatalf("a read of %d bytes at %d crosses the record boundary at %d", n, len(got), bounds[next])
			}
			got = append(got, p[:n]...)
		}
		if err != nil {
			if err != io.EOF {
				t.Fatalf("Read: %v", err)
			}
			break
		}
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("read %d bytes that differ from the %d sent", len(got), len(stream))
	}
	if r.in.buffered() {
		t.Error("a buffer is held after every byte was taken")
	}
}
