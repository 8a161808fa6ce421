package fsrv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"github.com/hugelgupf/p9/linux"
)

// rawSession speaks one dialect over c by hand: requests are written as
// transcript lines (9P2000.L) or Fcalls (9P2000), replies read with a
// bound and returned as text.
type rawSession struct {
	t    *testing.T
	c    net.Conn
	dotl bool
}

func (r *rawSession) frame(line string) []byte {
	r.t.Helper()
	if r.dotl {
		return dotlFrame(r.t, line)
	}
	f, err := parsePlan9(line)
	if err != nil {
		r.t.Fatalf("%s: %v", line, err)
	}
	b, err := f.Bytes()
	if err != nil {
		r.t.Fatalf("%s: %v", line, err)
	}
	return b
}

func (r *rawSession) reply() string {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := readFrame(r.c, 1<<24)
	if err != nil {
		r.t.Fatalf("reading a reply: %v", err)
	}
	if r.dotl {
		m, err := decodeDotL(b, func(uint64) uint64 { return 0 })
		if err != nil {
			r.t.Fatalf("undecodable %x: %v", b, err)
		}
		return m.String()
	}
	f, err := plan9.UnmarshalFcall(b)
	if err != nil {
		r.t.Fatalf("undecodable %x: %v", b, err)
	}
	return f.String()
}

// rpc sends line and returns the reply.
func (r *rawSession) rpc(line string) string {
	r.t.Helper()
	if _, err := r.c.Write(r.frame(line)); err != nil {
		r.t.Fatalf("%s: %v", line, err)
	}
	return r.reply()
}

// start negotiates msize and attaches fid 1 at the root.
func (r *rawSession) start(msize int) {
	r.t.Helper()
	if r.dotl {
		r.rpc(fmt.Sprintf("Tversion tag NOTAG msize %d version 9P2000.L", msize))
		r.rpc("Tattach tag 1 fid 1 afid NOFID uname root aname '' nuname 0")
	} else {
		r.rpc(fmt.Sprintf("Tversion tag 65535 msize %d version 9P2000", msize))
		r.rpc("Tattach tag 1 fid 1 afid NOFID uname glenda aname ''")
	}
}

// walk is a Twalk line from fid to newfid through names.
func (r *rawSession) walk(tag uint16, fid, newfid uint32, names ...string) string {
	if r.dotl {
		return fmt.Sprintf("Twalk tag %d fid %d newfid %d wname [%s]", tag, fid, newfid, strings.Join(names, " "))
	}
	line := fmt.Sprintf("Twalk tag %d fid %d newfid %d", tag, fid, newfid)
	if len(names) > 0 {
		line += " wname " + strings.Join(names, " ")
	}
	return line
}

func (r *rawSession) open(tag uint16, fid uint32) string {
	if r.dotl {
		return fmt.Sprintf("Tlopen tag %d fid %d flags O_RDONLY", tag, fid)
	}
	return fmt.Sprintf("Topen tag %d fid %d mode OREAD", tag, fid)
}

var dialects = []struct {
	name string
	dotl bool
}{{"9P2000.L", true}, {"9P2000", false}}

// heapInUse is the heap the process holds after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC() // the second empties sync.Pools of what the first kept
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// rss is the process's resident set, from /proc (0 where there is none).
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb uint64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// TestReadFlood: 20,000 Treads of 262,000 bytes that the client never
// collects. The server stops reading the connection at MaxRequests in
// flight, so the flood holds about 64 reads' buffers, not 20,000; other
// connections are served meanwhile, and once the client reads, every
// request is answered.
func TestReadFlood(t *testing.T) {
	const (
		n     = 20000
		count = 262000
		msize = 256 << 10
	)
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			fx := newFixture()
			for i := range 20 {
				fx.appendEvent(fmt.Sprintf("ts=%d event=ready\n", i))
			}
			srv := fx.server(t)
			srv.MaxMsize = msize
			stalled := make(chan *tracker, 1)
			srv.testTracker = func(tr *tracker) {
				tr.onStall = func() {
					select {
					case stalled <- tr:
					default:
					}
				}
			}
			addr := listen(t, srv)
			c := pipe(t, srv)
			r := &rawSession{t: t, c: c, dotl: d.dotl}
			r.start(msize)
			r.rpc(r.walk(1, 1, 2, "events"))
			r.rpc(r.open(1, 2))

			before, rssBefore := heapInUse(), rss()
			var written atomic.Int64
			flood := make(chan error, 1)
			go func() {
				for i := range n {
					tag := uint16(i % 60000)
					line := fmt.Sprintf("Tread tag %d fid 2 offset 0 count %d", tag, count)
					if _, err := c.Write(r.frame(line)); err != nil {
						flood <- err
						return
					}
					written.Add(1)
				}
				flood <- nil
			}()
			tr := <-stalled
			during, rssDuring := heapInUse(), rss()
			if got := tr.inFlight(); got != MaxRequests {
				t.Errorf("in flight while stalled = %d; want %d", got, MaxRequests)
			}
			if w := written.Load(); w > MaxRequests+2 {
				t.Errorf("the server read %d requests of a client that collects no reply; want about %d", w, MaxRequests)
			}
			grew := int64(during) - int64(before)
			t.Logf("%s: %d Treads of %d bytes uncollected: heap in use %.1f MB -> %.1f MB (+%.1f MB), RSS %.1f MB -> %.1f MB",
				d.name, n, count, mb(before), mb(during), float64(grew)/1e6, mb(rssBefore), mb(rssDuring))
			if limit := int64(3 * MaxRequests * msize); grew > limit {
				t.Errorf("heap grew %d bytes during the flood; want under %d (%d requests of %d bytes)", grew, limit, MaxRequests, msize)
			}

			stillServes(t, addr)

			// The client collects: every request is answered.
			for i := range n {
				got := r.reply()
				if !strings.HasPrefix(got, "Rread") {
					t.Fatalf("reply %d = %s; want Rread", i, got)
				}
			}
			if err := <-flood; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mb(b uint64) float64 { return float64(b) / 1e6 }

// TestFidLimit: a connection may hold MaxFids fids; a walk to one more is
// refused with EMFILE ("too many open files: ...") and the connection
// stays usable: after a clunk the walk succeeds.
func TestFidLimit(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			r := &rawSession{t: t, c: rawConn(t, addr), dotl: d.dotl}
			r.start(8192)
			// fid 1 is the attach; 2 .. MaxFids make MaxFids, in batches
			// of 32 requests in flight.
			var batch bytes.Buffer
			inBatch := 0
			for fid := uint32(2); fid <= MaxFids; fid++ {
				batch.Write(r.frame(r.walk(uint16(fid%32), 1, fid)))
				inBatch++
				if inBatch == 32 || fid == MaxFids {
					r.c.Write(batch.Bytes())
					batch.Reset()
					for ; inBatch > 0; inBatch-- {
						if got := r.reply(); !strings.HasPrefix(got, "Rwalk") {
							t.Fatalf("walks to fids up to %d: %s; want Rwalk", fid, got)
						}
					}
				}
			}
			got := r.rpc(r.walk(3, 1, MaxFids+1))
			want := "Rerror tag 3 ename too many open files: the limit is 4096 fids per connection"
			if d.dotl {
				want = "Rlerror tag 3 ecode " + fmt.Sprint(uint32(linux.EMFILE))
			}
			if got != want {
				t.Errorf("walk to fid %d: %s; want %s", MaxFids+1, got, want)
			}
			// A walk of a fid onto itself makes none.
			if got := r.rpc(r.walk(4, 7, 7)); !strings.HasPrefix(got, "Rwalk tag 4") {
				t.Errorf("walk of fid 7 onto itself: %s; want Rwalk", got)
			}
			r.rpc(fmt.Sprintf("Tclunk tag 5 fid %d", 7))
			if got := r.rpc(r.walk(6, 1, MaxFids+1, "status")); !strings.HasPrefix(got, "Rwalk tag 6") {
				t.Errorf("after a clunk, walk to fid %d: %s; want Rwalk", MaxFids+1, got)
			}
			stillServes(t, addr)
		})
	}
}

// TestDuplicateTag: a tag reused while its request is in flight ends the
// connection (the replies could not be told apart, nor counted); others
// go on.
func TestDuplicateTag(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			entered, release := make(chan struct{}, 1), make(chan struct{})
			slow := &Ctl{Name: "slow", Handle: func(string) error {
				entered <- struct{}{}
				<-release
				return nil
			}}
			srv := &Server{Root: NewDir("", slow, &Text{Name: "status", Content: func() []byte { return []byte("READY\n") }}), Logger: testLogger(t)}
			addr := listen(t, srv)
			r := &rawSession{t: t, c: rawConn(t, addr), dotl: d.dotl}
			r.start(8192)
			r.rpc(r.walk(1, 1, 2, "slow"))
			if d.dotl {
				r.rpc("Tlopen tag 1 fid 2 flags O_WRONLY")
			} else {
				r.rpc("Topen tag 1 fid 2 mode OWRITE")
			}
			write := `Twrite tag 9 fid 2 offset 0 data "x\n"`
			r.c.Write(r.frame(write))
			<-entered
			r.c.Write(r.frame(write))
			got := replyAndHangup(t, r.c)
			close(release)
			if len(got) != 0 {
				t.Errorf("reply %x; want none and the connection closed", got)
			}
			stillServes9(t, addr)
		})
	}
}

// stillServes9 is stillServes for a tree without the fixture's files.
func stillServes9(t *testing.T, addr string) {
	t.Helper()
	if _, err := dial9(t, addr).Stat("status"); err != nil {
		t.Fatalf("after bad input, 9P2000 Stat(status) = %v", err)
	}
}

// TestStalledMessage: a connection that sends half a message and stalls
// is closed after MessageTimeout; one that idles between messages is not
// (every other test idles between messages), and others are served.
func TestStalledMessage(t *testing.T) {
	fx := newFixture()
	srv := fx.server(t)
	srv.MessageTimeout = 50 * time.Millisecond
	addr := listen(t, srv)
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			r := &rawSession{t: t, c: rawConn(t, addr), dotl: d.dotl}
			r.start(8192)
			f := r.frame(r.walk(1, 1, 2, "status"))
			r.c.Write(f[:len(f)-3])
			if got := replyAndHangup(t, r.c); len(got) != 0 {
				t.Errorf("reply = %x; want none and the connection closed", got)
			}
			stillServes(t, addr)
		})
	}
}

// syncBuffer is a bytes.Buffer for a logger written from the server's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMaxConns: past Server.MaxConns a new connection is told the server
// is full (ENFILE to its Tversion) and closed (issue 21: it used to be
// closed without a word, and the client could not tell why), the refusals are logged at most once a minute, the connections served
// are not disturbed, and a place given back is taken again.
func TestMaxConns(t *testing.T) {
	fx := newFixture()
	var logs syncBuffer
	srv := &Server{Root: fx.root, Clock: fx.clock, Logger: slog.New(slog.NewTextHandler(&logs, nil)), MaxConns: 2}
	released := make(chan struct{}, 10)
	srv.testReleased = func() { released <- struct{}{} }
	addr := listen(t, srv)

	var served []*rawSession
	for range 2 {
		r := &rawSession{t: t, c: rawConn(t, addr), dotl: true}
		r.start(8192)
		served = append(served, r)
	}
	refusedNow := func() {
		t.Helper()
		c := rawConn(t, addr)
		c.Write(versionFrame(msgTversion, noTag, 8192, "9P2000.L"))
		if got, want := replyAndHangup(t, c), rlerror(noTag, linux.ENFILE); !bytes.Equal(got, want) {
			t.Errorf("connection past the cap: reply %x; want %x (ENFILE) and the connection closed", got, want)
		}
	}
	refusedNow()
	refusedNow()
	if n := strings.Count(logs.String(), "connections refused"); n != 1 {
		t.Errorf("after two refusals, %d log lines; want 1:\n%s", n, logs.String())
	}
	fx.clock.Advance(time.Minute)
	refusedNow()
	if n := strings.Count(logs.String(), "connections refused"); n != 2 || !strings.Contains(logs.String(), "refused=2") {
		t.Errorf("a minute later, %d log lines; want 2, the second counting 2 refusals:\n%s", n, logs.String())
	}
	// The two served are untouched.
	for i, r := range served {
		if got := r.rpc("Twalk tag 1 fid 1 newfid 2 wname [status]"); !strings.HasPrefix(got, "Rwalk tag 1") {
			t.Errorf("served connection %d: %s; want Rwalk", i, got)
		}
	}
	served[0].c.Close()
	<-released
	r := &rawSession{t: t, c: rawConn(t, addr), dotl: false}
	r.start(8192)
	if got := r.rpc("Twalk tag 1 fid 1 newfid 2 wname status"); !strings.HasPrefix(got, "Rwalk tag 1") {
		t.Errorf("after a connection left, a new one: %s; want Rwalk", got)
	}
}

// TestUncollectedReplies: a client that sends requests and never reads a
// reply is dropped once a reply has waited MessageTimeout for it, and
// what its requests held is given back.
func TestUncollectedReplies(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			fx := newFixture()
			srv := fx.server(t)
			srv.MessageTimeout = 50 * time.Millisecond
			addr := listen(t, srv)
			client, server := net.Pipe()
			done := make(chan struct{})
			go func() {
				defer close(done)
				srv.ServeConn(t.Context(), server)
			}()
			defer client.Close()
			r := &rawSession{t: t, c: client, dotl: d.dotl}
			r.start(8192)
			r.rpc(r.walk(1, 1, 2, "status"))
			r.rpc(r.open(1, 2))
			// The pipe holds nothing: the first reply already waits.
			for i := range MaxRequests {
				if _, err := client.Write(r.frame(fmt.Sprintf("Tread tag %d fid 2 offset 0 count 100", i))); err != nil {
					break // dropped already
				}
			}
			<-done // ServeConn returns: the connection is closed, its requests done
			stillServes(t, addr)
		})
	}
}

// TestPlan9VersionInSession: a 9P2000 Tversion inside a session lowers
// the msize that error strings are clipped to, and one below MinMsize is
// refused and ends the connection, as the first one would be (srv9p
// would take it and then drop every reply larger than it).
func TestPlan9VersionInSession(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	r := &rawSession{t: t, c: rawConn(t, addr)}
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	r.start(8192)
	if got := r.rpc("Tversion tag 65535 msize 300 version 9P2000"); got != "Rversion tag 65535 msize 300 version '9P2000'" {
		t.Fatalf("Tversion 300: %s", got)
	}
	r.start(300)
	r.rpc(r.walk(1, 1, 2, "ctl"))
	r.rpc("Topen tag 1 fid 2 mode OWRITE")
	r.c.Write(r.frame(`Twrite tag 1 fid 2 offset 0 data "` + strings.Repeat("x", 270) + `\n"`))
	f, err := plan9.ReadFcall(r.c)
	if b, _ := f.Bytes(); err != nil || f.Type != plan9.Rerror || len(b) > 300 || !strings.HasPrefix(f.Ename, "invalid argument: unknown command") {
		t.Errorf("long command at msize 300: %v, %v; want an Rerror that fits", f, err)
	}
	r.c.Write(r.frame("Tversion tag 65535 msize 100 version 9P2000"))
	f, err = plan9.ReadFcall(r.c)
	if err != nil || f.Type != plan9.Rerror || f.Ename != "invalid argument: msize 100 is below the minimum 256" {
		t.Errorf("Tversion 100: %v, %v; want Rerror msize below the minimum", f, err)
	}
	if got := replyAndHangup(t, r.c); len(got) != 0 {
		t.Errorf("then %x; want the connection closed", got)
	}
	stillServes(t, addr)
}

// TestXattrCreateRefused: a Txattrcreate of 2^62 bytes on a read-only
// listener, then 64 MiB of Twrites appended at the growing offset, as an
// attacker sent them. hugelgupf/p9 kept every byte in memory until the
// clunk (a node went from 25 MB to 1.7 GB); now the Txattrcreate is
// refused, every Twrite after it too, and the heap does not grow by the
// bytes written.
func TestXattrCreateRefused(t *testing.T) {
	const (
		msize = 256 << 10
		total = 64 << 20
	)
	fx := newFixture()
	srv := fx.server(t)
	srv.MaxMsize = msize
	l, err := Listen("tcp!127.0.0.1!0,ro")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv, l)
	r := &rawSession{t: t, c: rawConn(t, addr), dotl: true}
	r.start(msize)
	if got, want := r.rpc(r.walk(1, 1, 2, "status")), "Rwalk tag 1 wqid [0x0.0]"; got != want {
		t.Fatalf("walk to status: reply %s; want %s", got, want)
	}
	if got, want := r.rpc("Txattrcreate tag 1 fid 2 name user.x size 4611686018427387904 flags 0"), "Rlerror tag 1 ecode EOPNOTSUPP"; got != want {
		t.Fatalf("Txattrcreate of 2^62 bytes: reply %s; want %s", got, want)
	}

	before := heapInUse()
	chunk := make([]byte, msize-headerSize-twriteFixed)
	done := make(chan error, 1)
	go func() {
		for off := 0; off < total; off += len(chunk) {
			frame := binary.LittleEndian.AppendUint32(nil, uint32(headerSize+twriteFixed+len(chunk)))
			frame = binary.LittleEndian.AppendUint16(append(frame, msgTwrite), uint16(2+off/len(chunk)))
			frame = binary.LittleEndian.AppendUint32(frame, 2)
			frame = binary.LittleEndian.AppendUint64(frame, uint64(off))
			frame = binary.LittleEndian.AppendUint32(frame, uint32(len(chunk)))
			if _, err := r.c.Write(append(frame, chunk...)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for off := 0; off < total; off += len(chunk) {
		if got := r.reply(); !strings.HasPrefix(got, "Rlerror") || !strings.HasSuffix(got, "ecode EINVAL") {
			t.Fatalf("Twrite at offset %d after the refused Txattrcreate: reply %s; want Rlerror EINVAL", off, got)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	grew := int64(heapInUse()) - int64(before)
	t.Logf("%d MiB of Twrites after a Txattrcreate of 2^62 bytes: heap %+.1f MB", total>>20, float64(grew)/1e6)
	if limit := int64(total / 4); grew > limit {
		t.Errorf("heap grew %d bytes while %d bytes of Twrites were refused; want under %d", grew, total, limit)
	}
	if got, want := r.rpc("Tclunk tag 1 fid 2"), "Rclunk tag 1"; got != want {
		t.Errorf("clunk: reply %s; want %s", got, want)
	}
	stillServes(t, addr)
}

// TestReadCountPastMsize: a Tread whose count is past msize made
// hugelgupf/p9 slice past its buffer (a panic, its stack logged, EFAULT);
// read(5) lets the server return fewer bytes, and it does.
func TestReadCountPastMsize(t *testing.T) {
	fx := newFixture()
	addr := listen(t, fx.server(t))
	r := &rawSession{t: t, c: rawConn(t, addr), dotl: true}
	r.start(8192)
	r.rpc(r.walk(1, 1, 2, "status"))
	r.rpc(r.open(1, 2))
	for _, count := range []uint32{8192 - rreadHeader + 1, 1 << 20, 4<<20 - 1} {
		line := fmt.Sprintf("Tread tag 1 fid 2 offset 0 count %d", count)
		if got, want := r.rpc(line), `Rread tag 1 data "READY\n"`; got != want {
			t.Errorf("%s with msize 8192: reply %s; want %s", line, got, want)
		}
	}
}

// TestInFlightBudget: the connections of TCP and TLS listeners share
// Server.MaxInFlightBytes. A client that floods Treads and never collects
// the replies holds its first request and the budget's worth (4 of
// msize), not MaxRequests; a second such client, the budget being spent,
// holds one; a fresh client is still served; a unix socket client is not
// counted (MaxRequests); once the first client collects, the second goes
// on and every request is answered.
func TestInFlightBudget(t *testing.T) {
	const (
		msize  = 64 << 10
		budget = 4 * msize
		n      = 3000 // 190 MB of replies: more than the sockets' buffers
	)
	fx := newFixture()
	for i := range 2000 {
		fx.appendEvent(fmt.Sprintf("ts=%d event=ready shard=%d\n", i, i))
	}
	srv := fx.server(t)
	srv.MaxMsize = msize
	srv.MaxInFlightBytes = budget
	// The hook runs with the tracker's lock held: it reads what the
	// tracker holds at the moment the server stops reading.
	type stall struct {
		tr     *tracker
		shared bool
		n      int
	}
	stalled := make(chan stall, 64)
	srv.testTracker = func(tr *tracker) {
		tr.onStall = func() {
			select {
			case stalled <- stall{tr, tr.budget != nil, len(tr.reqs)}:
			default:
			}
		}
	}
	addr := listen(t, srv)
	sock, err := Listen("unix!" + t.TempDir() + "/s")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, sock)

	flood := func(c net.Conn) *rawSession {
		r := &rawSession{t: t, c: c, dotl: true}
		r.start(msize)
		r.rpc(r.walk(1, 1, 2, "events"))
		r.rpc(r.open(1, 2))
		go func() {
			for i := range n {
				if _, err := c.Write(r.frame(fmt.Sprintf("Tread tag %d fid 2 offset 0 count %d", 10+i, msize-rreadHeader))); err != nil {
					return // the test is over
				}
			}
		}()
		return r
	}
	collect := func(name string, r *rawSession) {
		for i := range n {
			if got := r.reply(); !strings.HasPrefix(got, "Rread") {
				t.Fatalf("%s: reply %d = %s; want Rread", name, i, got)
			}
		}
	}
	a := flood(rawConn(t, addr))
	b := flood(rawConn(t, addr))
	c, err := net.Dial("unix", sock.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u := flood(c)

	// Wait until both TCP clients and the unix one have stopped being
	// read; a TCP connection never has more than its own request and
	// the budget's in flight.
	tcp := map[*tracker]bool{}
	unixFull := false
	deadline := time.After(time.Minute)
	for len(tcp) < 2 || !unixFull {
		select {
		case st := <-stalled:
			tr, shared, n := st.tr, st.shared, st.n
			switch {
			case !shared:
				unixFull = unixFull || n == MaxRequests
			case n > 1+budget/msize:
				t.Fatalf("a TCP client that collects no reply has %d requests in flight; want at most %d (one and the budget's)", n, 1+budget/msize)
			case n > 0:
				tcp[tr] = true
			}
		case <-deadline:
			t.Fatalf("after a minute, %d TCP clients and the unix one (%v) stopped being read; want 2 and true", len(tcp), unixFull)
		}
	}
	stillServes(t, addr)

	collect("first TCP client", a)
	collect("second TCP client", b)
	collect("unix socket client", u)
}
