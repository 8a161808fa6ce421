package relay

import (
	"io"
	"net"
	"testing"
)

// A held batchConn writes nothing until release, then everything in one
// write, in order; Close writes what was gathered before it closes.
func TestBatchConnHoldsUntilRelease(t *testing.T) {
	server, peer := net.Pipe()
	defer peer.Close()
	b := &batchConn{Conn: server}
	got := make(chan string, 4)
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := peer.Read(buf)
			if err != nil {
				close(got)
				return
			}
			got <- string(buf[:n])
		}
	}()
	b.hold()
	for _, p := range []string{"one ", "two ", "three"} {
		if n, err := b.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil", p, n, err, len(p))
		}
	}
	select {
	case s := <-got:
		t.Fatalf("the peer read %q while the connection was held", s)
	default:
	}
	if err := b.release(); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "one two three" {
		t.Errorf("after release the peer read %q; want %q in one write", s, "one two three")
	}
	b.Write([]byte("alone")) // not held: written at once
	if s := <-got; s != "alone" {
		t.Errorf("unheld write: the peer read %q; want %q", s, "alone")
	}
	b.hold()
	b.Write([]byte("close frame"))
	b.Close()
	var rest string
	for s := range got {
		rest += s
	}
	if rest != "close frame" {
		t.Errorf("Close while held: the peer read %q; want %q", rest, "close frame")
	}
	if _, err := b.Write([]byte("x")); err == nil || err == io.EOF {
		t.Errorf("Write after Close = %v; want a closed-connection error", err)
	}
}
