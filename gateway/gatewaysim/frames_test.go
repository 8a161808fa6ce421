package gatewaysim

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// frameLog collects what OnFrame reports, in the order it arrives.
type frameLog chan Frame

func (l frameLog) next(t *testing.T) Frame {
	t.Helper()
	select {
	case f := <-l:
		return f
	case <-time.After(netWait):
		t.Fatal("OnFrame was not called")
		return Frame{}
	}
}

// OnFrame sees every client message with the connection it came on, the
// client's address, the shard it was about (from the session, the
// identify or the resumed session) and the close frame with its code, on
// the server's clock.
func TestOnFrame(t *testing.T) {
	log := make(frameLog, 32)
	fc := clock.NewFake()
	srv, _ := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2, HeartbeatInterval: time.Hour, Clock: fc, OnFrame: func(f Frame) { log <- f }})

	a := dial(t, srv, "")
	fc.Advance(time.Second)
	r, seq := a.start(srv, 1, 2)
	if f := log.next(t); f.Conn != 1 || f.Remote != a.ws.LocalAddr().String() || f.Shard != 1 || f.Op != opIdentify || !f.At.Equal(fc.Now()) {
		t.Fatalf("identify: %+v; want conn 1 from %s, shard 1, op 2 at %v", f, a.ws.LocalAddr(), fc.Now())
	}
	a.heartbeat(1)
	a.expect(opHeartbeatACK, "")
	if f := log.next(t); f.Shard != 1 || f.Op != opHeartbeat {
		t.Fatalf("heartbeat of a session: %+v; want shard 1, op 1", f)
	}
	a.closeWith(4000)
	if f := log.next(t); f.Conn != 1 || f.Shard != 1 || f.Total != 2 || f.Op != OpClose || f.Code != 4000 || f.Reply {
		t.Fatalf("close: %+v; want conn 1, shard 1 of 2, OpClose 4000 started by the client", f)
	}

	b := dialQuery(t, r.ResumeGatewayURL, "v=10&encoding=json")
	b.expect(opHello, "")
	b.heartbeat(-1)
	b.expect(opHeartbeatACK, "")
	want := Frame{Conn: 2, Remote: b.ws.LocalAddr().String(), Shard: -1, Op: opHeartbeat, At: fc.Now()}
	if f := log.next(t); f != want {
		t.Fatalf("heartbeat before identify: %+v; want %+v", f, want)
	}
	b.resume("no-such-session", 1)
	b.expect(opInvalidSession, "")
	if f := log.next(t); f.Conn != 2 || f.Shard != -1 || f.Op != opResume || f.Remote != b.ws.LocalAddr().String() {
		t.Fatalf("resume of an unknown session: %+v; want conn 2, shard -1, op 6 from %s", f, b.ws.LocalAddr())
	}
	b.resume(r.SessionID, seq)
	b.expect(opDispatch, "RESUMED")
	if f := log.next(t); f.Conn != 2 || f.Shard != 1 || f.Op != opResume {
		t.Fatalf("resume: %+v; want conn 2, shard 1, op 6", f)
	}
	b.sendRaw([]byte("not json"))
	b.expectClose(CloseDecodeError)
	if f := log.next(t); f.Shard != 1 || f.Op != -1 {
		t.Fatalf("a payload that does not decode: %+v; want shard 1, op -1", f)
	}
	// The client answers the server's close: a reply.
	b.closeWith(CloseDecodeError)
	if f := log.next(t); f.Conn != 2 || f.Op != OpClose || f.Code != CloseDecodeError || !f.Reply {
		t.Fatalf("the closing handshake's answer: %+v; want conn 2, OpClose 4002, Reply", f)
	}
}
