package gatewaysim

import (
	"testing"
	"time"
)

// QuietAfter: a silent client's session leaves LiveSessions while its
// connection stays open; a second session of the shard then counts once,
// and a frame on the quiet connection (a woken, paused client writing on
// its old socket) counts both, in MaxLiveSessions too. Closing a quiet
// connection counts nothing twice.
func TestQuietSessions(t *testing.T) {
	srv, fc := newTestServer(t, Config{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Hour, QuietAfter: 2 * time.Second})
	a := dial(t, srv, "")
	a.start(srv, 0, 1)
	if st := srv.Stats(0); st.LiveSessions != 1 {
		t.Fatalf("after identify: %+v", st)
	}
	fc.Advance(5 * time.Second) // the identify bucket's interval
	waitFor(t, srv, "a quiet", func() bool { return srv.Stats(0).LiveSessions == 0 })
	b := dial(t, srv, "")
	b.start(srv, 0, 1)
	if st := srv.Stats(0); st.LiveSessions != 1 || st.MaxLiveSessions != 1 {
		t.Fatalf("b live beside quiet a: %+v; want 1 live, max 1", st)
	}
	a.heartbeat(-1)
	a.expect(opHeartbeatACK, "") // a's connection is still open
	if st := srv.Stats(0); st.LiveSessions != 2 || st.MaxLiveSessions != 2 {
		t.Fatalf("a wrote on its old socket: %+v; want 2 live, max 2", st)
	}
	fc.Advance(2 * time.Second)
	waitFor(t, srv, "both quiet", func() bool { return srv.Stats(0).LiveSessions == 0 })
	a.closeWith(1000)
	waitFor(t, srv, "a's session ended", func() bool { return len(srv.Sessions(0)) == 1 })
	b.heartbeat(-1)
	b.expect(opHeartbeatACK, "")
	if st := srv.Stats(0); st.LiveSessions != 1 {
		t.Fatalf("after a quiet close and b's heartbeat: %+v; want 1 live", st)
	}
}
