package fsrv

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/p9"
	"github.com/shardfs/shardfs/clock"
	"golang.org/x/sync/semaphore"
)

// Server serves one tree over 9P2000.L and 9P2000 on the same listeners.
// Set its fields before the first Serve or ServeConn; the zero value of each
// optional field is a sensible default. A Server must not be copied after
// first use.
type Server struct {
	// Root is the tree served. Required.
	Root *Dir

	// Logger receives connection-level events (debug) and protocol errors.
	// Nil discards them.
	Logger *slog.Logger

	// Clock stamps the times at which the server notices that a file
	// changed (the mtime of text files, directories and ctl files). Nil
	// means real time.
	Clock clock.Clock

	// VersionTimeout bounds the wait for a connection's Tversion. Zero
	// means 10 s.
	VersionTimeout time.Duration

	// MaxMsize caps the negotiated message size. Zero means
	// DefaultMaxMsize. Values below MinMsize are raised to it.
	MaxMsize uint32

	// MaxConns caps the connections Serve serves at once, over all its
	// listeners. Past it a new connection is closed at once, and the
	// refusals are logged at most once a minute. Zero means
	// DefaultMaxConns. ServeConn's connections are not counted.
	MaxConns int

	// MessageTimeout bounds the time from the first byte of a message
	// to its last, in both directions: a connection that stalls inside a
	// request longer, or does not take a reply within it, is closed, so
	// that half a message or replies never read hold nothing forever.
	// Between messages a connection may idle as long as it likes. Zero
	// means DefaultMessageTimeout.
	MessageTimeout time.Duration

	// HandshakeTimeout bounds a TLS listener's handshake, counted from
	// the accept. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	// MaxHandshakes caps the connections of each TCP or TLS listener
	// that are still in their handshake (TLS, then the 9P Tversion),
	// MaxHandshakesPerAddr those of each listener from one address (a
	// process of this host: its uid's from one address), and
	// MaxHandshakesPerPrefix those from one prefix (another host's /24 or
	// /64; a process of this host: its uid, from any address). Zero
	// means DefaultMaxHandshakes, DefaultMaxHandshakesPerAddr and four
	// times the per-address cap. Unix socket connections are not
	// counted.
	MaxHandshakes, MaxHandshakesPerAddr, MaxHandshakesPerPrefix int

	// UnixReserve is how many of MaxConns only unix socket connections
	// may take. Zero means DefaultUnixReserve; negative, none. It is
	// never more than a quarter of MaxConns.
	UnixReserve int

	// IdleTimeout closes a TCP or TLS connection Serve holds that had no
	// request for that long. Zero means DefaultIdleTimeout; negative,
	// never. Unix socket connections (the operator's own, mode 0600) are
	// not closed for idling, so that a mount through one survives a quiet
	// night.
	IdleTimeout time.Duration

	// MaxInFlightBytes bounds, over all the connections of Serve's TCP
	// and TLS listeners together, the replies their requests may have in
	// flight, counted at msize bytes a request: the memory that clients
	// which send requests and never collect the replies hold (each
	// connection's own bound, MaxRequests, times a thousand connections
	// was gigabytes). A connection may always have one request in flight
	// outside it, so that one client's flood slows the others but never
	// stops them; past it, the server stops reading a connection until
	// room is given back. Unix socket connections and ServeConn's are not
	// counted. Zero means DefaultMaxInFlightBytes; negative, no bound.
	MaxInFlightBytes int64

	// Audit, when set, is called for every command line a Ctl applied,
	// after the log line that records it (see AuditRecord). It is called
	// with the Ctl's writes held: it must not block.
	Audit func(AuditRecord)

	// testIdleClock, if set, times the idle timeout, which otherwise
	// runs on real time like the other connection timeouts (Clock is
	// the tree's: tests advance it by hours for their shards).
	testIdleClock clock.Clock

	// testTracker, if set, is given each connection's tracker;
	// testReleased is called when Serve gives a connection's place back.
	testTracker  func(*tracker)
	testReleased func()

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	active    sync.WaitGroup // ServeConn calls in progress
	accepted  int            // connections Serve is serving, for MaxConns
	// handshaking counts the TCP and TLS connections before their
	// Tversion over all listeners (their budgets count each listener's);
	// telling, the refused ones being told that the server is full.
	handshaking int
	budgets     map[net.Listener]*listenerBudget
	telling     int
	testSeen    int       // connections admit looked at, for measurements
	refused     int       // connections refused since the last log line
	refusedAt   time.Time // when that line was logged
	// inFlight is the budget of MaxInFlightBytes, made at first use.
	inFlight *semaphore.Weighted
	// refusals rate-limits the log lines of refused TLS clients and of
	// writes on read-only listeners, by reason.
	refusals map[string]*refusalCount
}

// Connections returns the number of connections being served.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ErrServerClosed is returned by ServeConn after Close.
var ErrServerClosed = errors.New("fsrv: server closed")

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// inFlightBudget returns the budget of MaxInFlightBytes and its size; nil
// for no bound.
func (s *Server) inFlightBudget() (*semaphore.Weighted, int64) {
	size := s.MaxInFlightBytes
	switch {
	case size < 0:
		return nil, 0
	case size == 0:
		size = DefaultMaxInFlightBytes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight == nil {
		s.inFlight = semaphore.NewWeighted(size)
	}
	return s.inFlight, size
}

func (s *Server) now() time.Time { return clock.Or(s.Clock).Now() }

func (s *Server) maxMsize() uint32 {
	switch {
	case s.MaxMsize == 0:
		return DefaultMaxMsize
	case s.MaxMsize < MinMsize:
		return MinMsize
	}
	return s.MaxMsize
}

func (s *Server) maxConns() int {
	if s.MaxConns <= 0 {
		return DefaultMaxConns
	}
	return s.MaxConns
}

func (s *Server) messageTimeout() time.Duration {
	if s.MessageTimeout <= 0 {
		return DefaultMessageTimeout
	}
	return s.MessageTimeout
}

func (s *Server) versionTimeout() time.Duration {
	if s.VersionTimeout <= 0 {
		return 10 * time.Second
	}
	return s.VersionTimeout
}

// Serve accepts connections on l and serves each until ctx is done or
// Close is called; then it closes l and every connection it accepted, waits
// for their goroutines, and returns nil. It returns l's error if accepting
// fails for another reason (after the same cleanup). The connections of a
// ReadOnly listener (Listen's ",ro") are served read-only.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()

	ro := isReadOnly(l)
	lb := s.newListenerBudget(l)
	s.mu.Lock()
	if s.budgets == nil {
		s.budgets = make(map[net.Listener]*listenerBudget)
	}
	s.budgets[l] = lb
	s.mu.Unlock()
	lname := AddrString(l)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // ends the connections of this listener
		wg.Wait()
		s.mu.Lock()
		delete(s.listeners, l)
		delete(s.budgets, l)
		s.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()

	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || s.isClosed() {
				return nil
			}
			if isTemporary(err) {
				// Out of file descriptors, or a connection reset before
				// accept: wait and go on, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logger().Warn("fsrv: accept", "err", err, "retry", delay)
				select {
				case <-time.After(delay):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			l.Close()
			return err
		}
		delay = 0
		a, ok := s.admit(c, lb)
		if !ok {
			s.tellFull(&wg, c)
			continue
		}
		wg.Go(func() {
			defer s.release(a)
			if tc, ok := c.(*net.TCPConn); ok && !ro {
				if err := checkLocalPeer(tc, os.Getuid()); err != nil {
					s.localPeerRefused(c.RemoteAddr().String(), err)
					refuseLocalPeer(c, err)
					return
				}
			}
			var roCert bool
			var auth *tlsAuth
			if p, ok := c.(*pendingTLS); ok {
				if c, roCert = s.handshake(ctx, p); c == nil {
					return
				}
				auth = p.auth
			}
			if err := s.serveConnFrom(ctx, c, ro, roCert && !ro, a, lname, auth); err != nil {
				s.logger().Info("fsrv: connection refused", "remote", c.RemoteAddr().String(), "err", err)
			}
		})
	}
}

func isTemporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.ECONNRESET} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops every Serve and ServeConn, closes their listeners and
// connections, and waits until no connection is being served.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	var ls []net.Listener
	for l := range s.listeners {
		ls = append(ls, l)
	}
	var cs []*conn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range cs {
		c.close()
	}
	s.active.Wait()
	return nil
}

// ServeConn serves one connection that is already established (a socket
// from elsewhere, one end of a socketpair handed to a VM) until the client
// goes away, ctx is done or Close is called, and closes it. It returns when
// every goroutine and callback serving the connection has finished. The
// error says why the connection was refused during version negotiation; it
// is nil once a session was served.
func (s *Server) ServeConn(ctx context.Context, rwc io.ReadWriteCloser) error {
	return s.serveConn(ctx, rwc, false, nil)
}

// serveConn serves rwc; a is its share of Serve's budgets (nil for
// ServeConn's).
func (s *Server) serveConn(ctx context.Context, rwc io.ReadWriteCloser, ro bool, a *admission) error {
	return s.serveConnFrom(ctx, rwc, ro, false, a, "-", nil)
}

// serveConnFrom is serveConn for a connection of the listener named
// listener; roCert: the connection is read-only because the listener's
// rules make its client certificate so (ro is the listener's ",ro");
// auth, the TLS listener's policy, which the connection's certificate
// must keep passing at each reload.
func (s *Server) serveConnFrom(ctx context.Context, rwc io.ReadWriteCloser, ro, roCert bool, a *admission, listener string, auth *tlsAuth) error {
	if s.Root == nil {
		rwc.Close()
		return errors.New("fsrv: Server.Root is nil")
	}
	c := &conn{s: s, sess: &session{Server: s, ro: ro || roCert, roCert: roCert}, t: newTracker(), rwc: rwc, adm: a, listener: listener, who: identity(rwc)}
	c.t.now = clock.Or(s.testIdleClock).Now
	if a != nil && !a.l.unix {
		if b, size := s.inFlightBudget(); b != nil {
			c.t.share(b, func() int64 { return min(int64(c.sess.msize.Load()), size) })
		}
	}
	c.sess.conn = c
	if s.testTracker != nil {
		s.testTracker(c.t)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		rwc.Close()
		return ErrServerClosed
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	s.active.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.active.Done()
	}()
	stop := context.AfterFunc(ctx, c.close)
	defer stop()
	defer c.close()
	if tc, ok := rwc.(*tls.Conn); ok && auth != nil {
		if st := tc.ConnectionState(); len(st.PeerCertificates) > 0 {
			cert := st.PeerCertificates[0]
			defer auth.watch(c, func() {
				if ok, why := auth.stillAllows(cert, c.sess.ro); !ok {
					s.logger().Warn("fsrv: TLS client no longer allowed after the reload: connection closed",
						"listener", listener, "remote", c.remote(), "client", certName(cert), "serial", Serial(cert), "reason", why)
					c.close()
				}
			})()
		}
	}
	return c.serve()
}

// conn is one client connection.
type conn struct {
	s    *Server
	sess *session
	t    *tracker
	rwc  io.ReadWriteCloser
	adm  *admission // nil: not counted in Serve's budgets
	idle *idleWatch // nil: not closed for idling
	// listener and who name the connection's listener and client in
	// audit lines (see AuditRecord).
	listener, who string

	closeOnce sync.Once
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.t.close()
		c.rwc.Close()
	})
}

func (c *conn) remote() string {
	if nc, ok := c.rwc.(net.Conn); ok {
		if a := nc.RemoteAddr(); a != nil {
			return a.String()
		}
	}
	return "-"
}

// client names the connection's client certificate, "-" without TLS.
func (c *conn) client() string {
	if tc, ok := c.rwc.(*tls.Conn); ok {
		if st := tc.ConnectionState(); len(st.PeerCertificates) > 0 {
			return certName(st.PeerCertificates[0])
		}
	}
	return "-"
}

type deadliner interface{ SetReadDeadline(time.Time) error }

func (c *conn) serve() error {
	log := c.s.logger().With("remote", c.remote())
	br := bufio.NewReaderSize(c.rwc, maxVersionFrame)

	// Bound the wait for Tversion: with a read deadline where the
	// connection has one, else by closing it.
	d, hasDeadline := c.rwc.(deadliner)
	if hasDeadline && d.SetReadDeadline(time.Now().Add(c.s.versionTimeout())) != nil {
		hasDeadline = false
	}
	var timer *time.Timer
	if !hasDeadline {
		timer = time.AfterFunc(c.s.versionTimeout(), c.close)
	}
	neg, err := sniff(br, c.rwc, c.s.maxMsize())
	c.s.handshakeDone(c.adm)
	if timer != nil && !timer.Stop() && err == nil {
		err = errors.New("fsrv: version negotiation timed out")
	}
	if hasDeadline {
		d.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil // a client that connects and leaves
		}
		return fmt.Errorf("fsrv: version: %w", err)
	}

	if c.adm != nil && !c.adm.l.unix && c.s.idleTimeout() > 0 {
		c.idle = &idleWatch{clk: clock.Or(c.s.testIdleClock), timeout: c.s.idleTimeout(), t: c.t, close: c.close}
		c.t.touch()
		c.idle.start()
		defer c.idle.stop()
	}

	// Bytes the sniffer read ahead belong to the engine.
	rest := io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c.rwc)
	wd := &watchdog{timeout: c.s.messageTimeout(), close: c.close}
	if hasDeadline {
		wd.d = d
	}
	defer wd.disarm()
	out := &replyWriter{w: c.rwc, timeout: c.s.messageTimeout(), fail: c.close}
	if wdl, ok := c.rwc.(writeDeadliner); ok {
		out.d = wdl
	}
	switch neg.dialect {
	case dialectDotL:
		log.Debug("fsrv: 9P2000.L session", "msize", neg.msize)
		attacher := dotlAttacher{c.sess}
		st := newDotlStream(readWriteCloser{rest, out, c.rwc}, c.t, neg.first, neg.msize, c.s.maxMsize(), attacher.attachQID)
		st.ending = &c.sess.ending
		c.sess.msize.Store(neg.msize)
		st.sessMsize = &c.sess.msize
		st.wd = wd
		for {
			srv := p9.NewServer(attacher, p9.WithServerLogger(ulogger{log}))
			srv.Handle(st, st)
			// A Tversion inside the session ends it and starts a new
			// one with no fids (version(5)); p9 has waited for its
			// requests and dropped its fids.
			if st.again == nil {
				break
			}
			st.reversion()
		}
	default:
		log.Debug("fsrv: 9P2000 session", "msize", neg.msize)
		c.sess.msize.Store(neg.msize)
		st := newPlan9Stream(rest, out, c.rwc, c.t, c.sess, neg.first, c.s.maxMsize())
		st.wd = wd
		for {
			g := new(gate)
			srv := c.sess.plan9Server(g, c.s.maxMsize())
			srv.Serve(st, st)
			// srv9p returns when its reader fails, without waiting for
			// the requests it started; wait for their callbacks here. A
			// Tversion inside the session ends it too, and starts a new
			// one with no fids (version(5)).
			if st.again != nil {
				g.close()
				st.reversion()
				continue
			}
			c.close()
			g.close()
			break
		}
	}
	log.Debug("fsrv: connection ended")
	return nil
}

// readWriteCloser puts a connection back together from parts.
type readWriteCloser struct {
	io.Reader
	io.Writer
	io.Closer
}

// ulogger adapts slog to the logger hugelgupf/p9 takes. p9 logs every
// message at this level, so it is debug output.
type ulogger struct{ l *slog.Logger }

func (u ulogger) Printf(format string, v ...any) {
	if u.l.Enabled(context.Background(), slog.LevelDebug) {
		u.l.Debug(fmt.Sprintf(format, v...))
	}
}
