package enroll

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/internal/refusal"
	"github.com/shardfs/shardfs/journal"
)

// Defaults of Config's bounds.
const (
	DefaultMaxPending        = 64
	DefaultMaxPendingPerAddr = 4
	DefaultMaxWait           = 10 * time.Minute
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultCodeTTL           = time.Hour
	DefaultMaxPerAddr        = 8
)

// Code is a one-time enrollment code given for one node.
type Code struct {
	// For is the node's MAC address (52:54:00:12:34:56) or name.
	For string
	// Code is the secret the node shows; NewCode makes one.
	Code string
	// Expires is when the code stops being accepted.
	Expires time.Time
}

// MinCodeLen is the shortest code a server takes: shorter ones could be
// guessed by whoever can reach the server.
const MinCodeLen = 12

// MinCodeBits is the least strength of a code a server takes, by
// WeakCode's estimate; NewCode's have 80.
const MinCodeBits = 60

// WeakCode says why a code (an operator's, written in --enroll-code) is
// too easy to guess, or "": shorter than MinCodeLen; fewer than six
// distinct characters ("000000000000", "abcabcabcabc"); or under
// MinCodeBits, counting each character as a draw from the classes the
// code uses (digits 10, letters 26, anything else 32 more). It is an
// upper bound on a written code's strength: one with a pattern or a word
// is weaker, and NewCode's are the ones to use.
func WeakCode(code string) string {
	c := normalCode(code)
	if len(c) < MinCodeLen {
		return fmt.Sprintf("shorter than %d characters", MinCodeLen)
	}
	distinct := map[rune]bool{}
	var digits, letters, other bool
	for _, r := range c {
		distinct[r] = true
		switch {
		case r >= '0' && r <= '9':
			digits = true
		case r >= 'A' && r <= 'Z':
			letters = true
		default:
			other = true
		}
	}
	if len(distinct) < 6 {
		return fmt.Sprintf("only %d distinct characters", len(distinct))
	}
	alphabet := 0
	for _, cl := range []struct {
		used bool
		n    int
	}{{digits, 10}, {letters, 26}, {other, 32}} {
		if cl.used {
			alphabet += cl.n
		}
	}
	if bits := float64(utf8.RuneCountInString(c)) * math.Log2(float64(alphabet)); bits < MinCodeBits {
		return fmt.Sprintf("about %.0f bits, under %d (NewCode's have 80)", bits, MinCodeBits)
	}
	return ""
}

// NewCode makes a code: 80 random bits in base32, in groups of four
// (ABCD-EFGH-IJKL-MNOP), to be typed on a console.
func NewCode() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	s := base32.StdEncoding.EncodeToString(b[:])
	return s[0:4] + "-" + s[4:8] + "-" + s[8:12] + "-" + s[12:16], nil
}

// normalCode is a code as compared: upper case, without dashes or blanks.
func normalCode(s string) string {
	return strings.ToUpper(strings.Map(func(r rune) rune {
		if r == '-' || r == ' ' || r == '\t' {
			return -1
		}
		return r
	}, s))
}

// Config configures a Server.
type Config struct {
	// Cert is the server's TLS certificate, issued by the enrollment CA
	// the nodes' image carries.
	Cert tls.Certificate
	// NodeCA signs the nodes' listener certificates.
	NodeCA *certs.CA
	// NodeNames name the nodes by MAC (as net.HardwareAddr.String
	// writes it): a node's listener certificate is issued for the name
	// given here, else for pxe- and its MAC (pxe-52-54-00-12-34-56, the
	// name a node takes by default). The name a request carries is shown
	// in /enroll/pending, never trusted.
	NodeNames map[string]string
	// Secrets are what every approved node gets (ListenerCert is made per
	// node).
	Secrets Secrets
	// Codes are the one-time codes.
	Codes []Code
	// MaxPending, MaxPendingPerAddr, MaxWait and HandshakeTimeout bound
	// the requests, and MaxPerAddr the connections in their handshake
	// from one address (the Default values when zero).
	MaxPending        int
	MaxPendingPerAddr int
	MaxPerAddr        int
	MaxWait           time.Duration
	HandshakeTimeout  time.Duration
	Clock             clock.Clock
	Logger            *slog.Logger
}

// Server is the enrollment server.
type Server struct {
	cfg    Config
	clk    clock.Clock
	log    *slog.Logger
	events *journal.Log
	tree   *fsrv.Dir

	// refusals keeps a flood's refusals from filling the log and
	// /enroll/events: keyed by reason (the refusal constants).
	refusals *refusal.Limiter

	mu          sync.Mutex
	pending     map[string]*request // by fingerprint
	approved    map[string]bool     // approved, not yet delivered
	denied      map[string]bool
	enrolled    map[string]enrolledNode
	codes       []*Code
	perAddr     map[string]int // connections in their handshake by remote address
	pendingAddr map[string]int // waiting requests by remote address
	// perPrefix and pendingPrefix count the same by prefix (see
	// prefixOf): one host's many IPv6 addresses, or a local user's many
	// loopback ones, are held to half of each bound.
	perPrefix     map[string]int
	pendingPrefix map[string]int
	// codeFails counts wrong codes by prefix (see codeFailed).
	codeFails map[string]*codeFail
}

// codeFail is one prefix's wrong codes: n since the last pause of
// codePause, the last at last; none is tried before until.
type codeFail struct {
	n           int
	last, until time.Time
}

// Wrong codes from one prefix: the first codeFreeTries are answered at
// once; then each waits twice as long as the one before, from a second
// up to codeMaxPause, during which that prefix's codes are refused
// unread (and spend nothing). codePause without a wrong code forgets
// them. At most maxCodeFails prefixes are remembered.
const (
	codeFreeTries = 5
	codeMaxPause  = 10 * time.Minute
	codePause     = 10 * time.Minute
	maxCodeFails  = 4096
)

// codeFailed counts a wrong code from prefix p.
func (s *Server) codeFailed(p string, now time.Time) {
	if s.codeFails == nil {
		s.codeFails = map[string]*codeFail{}
	}
	f := s.codeFails[p]
	if f == nil || now.Sub(f.last) >= codePause {
		if len(s.codeFails) >= maxCodeFails {
			for k, o := range s.codeFails {
				if now.Sub(o.last) >= codePause {
					delete(s.codeFails, k)
				}
			}
			if len(s.codeFails) >= maxCodeFails {
				return
			}
		}
		f = &codeFail{}
		s.codeFails[p] = f
	}
	f.n++
	f.last = now
	if f.n >= codeFreeTries {
		f.until = now.Add(min(time.Second<<min(f.n-codeFreeTries, 20), codeMaxPause))
	}
}

// request is a waiting request.
type request struct {
	fp, mac, addr string
	// name is the name the certificate will be issued for, requested
	// the one the node asked for (shown, never trusted).
	name, requested string
	since           time.Time
	verdict         chan bool // true: approved; buffered, sent once
}

// The kinds of refusal, each rate-limited on its own (refusal.Limiter
// keys), so that a flood of one kind leaves the lines of another.
const (
	refusedAddrBusy = iota // connections from one address
	refusedBusy            // all connections, or the pending list
	refusedBad             // malformed requests
	refusedCode            // wrong codes
	refusedKey             // denied or already enrolled keys
)

type enrolledNode struct {
	name, mac, addr, how string
	at                   time.Time
}

// New checks cfg and returns a server; nothing runs until Serve.
func New(cfg Config) (*Server, error) {
	if len(cfg.Cert.Certificate) == 0 {
		return nil, errors.New("enroll: no server certificate")
	}
	if cfg.NodeCA == nil {
		return nil, errors.New("enroll: no node CA to sign the listeners' certificates")
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxPerAddr <= 0 {
		cfg.MaxPerAddr = DefaultMaxPerAddr
	}
	if cfg.MaxPendingPerAddr <= 0 {
		cfg.MaxPendingPerAddr = DefaultMaxPendingPerAddr
	}
	for mac, name := range cfg.NodeNames {
		if _, err := net.ParseMAC(mac); err != nil {
			return nil, fmt.Errorf("enroll: node names: %w", err)
		}
		if !ValidName(name) {
			return nil, fmt.Errorf("enroll: node names: the name for %s is not a host name (a-z, 0-9, '-' and '.', at most %d)", mac, MaxName)
		}
	}
	s := &Server{cfg: cfg, clk: clock.Or(cfg.Clock), log: cfg.Logger, events: journal.New(1 << 20),
		pending: map[string]*request{}, approved: map[string]bool{}, denied: map[string]bool{}, enrolled: map[string]enrolledNode{},
		perAddr: map[string]int{}, pendingAddr: map[string]int{}, perPrefix: map[string]int{}, pendingPrefix: map[string]int{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.refusals = &refusal.Limiter{Clock: s.clk, Flush: func(key, suppressed int, window time.Duration, now time.Time, node bool) {
		if node {
			s.eventLocked(now, "event=refused reason=%s suppressed=%d window=%v", refusalReason(key), suppressed, window)
		}
	}}
	for _, c := range cfg.Codes {
		if why := WeakCode(c.Code); why != "" {
			return nil, fmt.Errorf("enroll: the code for %s is too easy to guess: %s", c.For, why)
		}
		if c.For == "" {
			return nil, errors.New("enroll: a code is for no node")
		}
		c.Code = normalCode(c.Code)
		s.codes = append(s.codes, &c)
	}
	s.tree = fsrv.NewDir("enroll",
		&fsrv.Text{Name: "pending", Content: s.pendingText},
		&fsrv.Text{Name: "enrolled", Content: s.enrolledText},
		&fsrv.Ctl{Name: "ctl", Handle: s.command, Usage: func() string { return "approve FINGERPRINT\ndeny FINGERPRINT\n" }},
		&fsrv.LogFile{Name: "events", Source: s.events},
	)
	return s, nil
}

// Dir is the server's /enroll: pending (one line per waiting request:
// fingerprint mac addr since name requested), enrolled (fingerprint name mac addr how
// at), ctl (approve FINGERPRINT, deny FINGERPRINT) and events.
func (s *Server) Dir() *fsrv.Dir { return s.tree }

func (s *Server) event(format string, args ...any) {
	s.eventLocked(s.clk.Now(), format, args...)
}

// eventLocked is event for the refusal limiter's Flush, which runs with
// the limiter's lock held; it takes no lock of the server either.
func (s *Server) eventLocked(now time.Time, format string, args ...any) {
	line := fmt.Sprintf("ts=%s ", now.UTC().Format("2006-01-02T15:04:05.000Z")) + fmt.Sprintf(format, args...) + "\n"
	s.events.Append([]byte(line), now)
	s.log.Info("enroll: " + strings.TrimSpace(line[strings.IndexByte(line, ' ')+1:]))
}

// refused logs a refusal of the given kind unless that kind, or all
// refusals together, had their share of the window (refusal.Burst and
// refusal.NodeBurst lines a minute, the window growing while the flood
// lasts); the suppressed ones are counted in one summary line.
func (s *Server) refused(kind int, format string, args ...any) {
	if _, node := s.refusals.Admit(kind, s.clk.Now()); node {
		s.event(format, args...)
	}
}

func refusalReason(kind int) string {
	switch kind {
	case refusedAddrBusy:
		return "busy-address"
	case refusedBusy:
		return "busy"
	case refusedBad:
		return "malformed"
	case refusedCode:
		return "code"
	case refusedKey:
		return "key"
	}
	return "all"
}

func (s *Server) pendingText() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	reqs := make([]*request, 0, len(s.pending))
	for _, r := range s.pending {
		reqs = append(reqs, r)
	}
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].since.Before(reqs[j].since) })
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "%s %s %s %s %s %s\n", r.fp, orDash(r.mac), r.addr, r.since.UTC().Format(time.RFC3339), r.name, orDash(r.requested))
	}
	return []byte(b.String())
}

func (s *Server) enrolledText() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	fps := make([]string, 0, len(s.enrolled))
	for fp := range s.enrolled {
		fps = append(fps, fp)
	}
	sort.Slice(fps, func(i, j int) bool { return s.enrolled[fps[i]].at.Before(s.enrolled[fps[j]].at) })
	var b strings.Builder
	for _, fp := range fps {
		e := s.enrolled[fp]
		fmt.Fprintf(&b, "%s %s %s %s %s %s\n", fp, orDash(e.name), orDash(e.mac), e.addr, e.how, e.at.UTC().Format(time.RFC3339))
	}
	return []byte(b.String())
}

func orDash(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\n") {
		return "-"
	}
	return s
}

// command is a line written to /enroll/ctl.
func (s *Server) command(line string) error {
	verb, fp, _ := strings.Cut(line, " ")
	fp = strings.TrimSpace(fp)
	switch verb {
	case "approve":
		return s.Approve(fp)
	case "deny":
		return s.Deny(fp)
	}
	return fmt.Errorf("%w: unknown command %q (approve FINGERPRINT, deny FINGERPRINT)", fs.ErrInvalid, verb)
}

// Approve lets the waiting request of fingerprint fp have its secrets.
func (s *Server) Approve(fp string) error {
	if !ValidFingerprint(fp) {
		return fmt.Errorf("%w: %q is not a fingerprint (sha256: and 64 hex digits, as /enroll/pending shows)", fs.ErrInvalid, fp)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.denied[fp]:
		return fmt.Errorf("%w: %s is denied", fs.ErrPermission, fp)
	case s.enrolled[fp].how != "":
		return fmt.Errorf("%w: %s is already enrolled: a key is served once", fs.ErrInvalid, fp)
	case s.approved[fp]:
		return nil
	}
	r := s.pending[fp]
	if r == nil {
		return fmt.Errorf("%w: no pending request from %s", fs.ErrNotExist, fp)
	}
	s.approved[fp] = true
	delete(s.pending, fp)
	r.verdict <- true
	s.event("event=approved fingerprint=%s name=%s mac=%s addr=%s", fp, r.name, orDash(r.mac), r.addr)
	return nil
}

// Deny refuses fingerprint fp's waiting request and every later one.
func (s *Server) Deny(fp string) error {
	if !ValidFingerprint(fp) {
		return fmt.Errorf("%w: %q is not a fingerprint (sha256: and 64 hex digits, as /enroll/pending shows)", fs.ErrInvalid, fp)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied[fp] = true
	delete(s.approved, fp)
	if r := s.pending[fp]; r != nil {
		delete(s.pending, fp)
		r.verdict <- false
	}
	s.event("event=denied fingerprint=%s", fp)
	return nil
}

// Serve answers enrollment requests on l (plain TCP: Serve does the TLS)
// until ctx ends, then closes l and waits for its connections.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	// Connections still in their handshake (TLS and the request line)
	// hold a slot until they wait or are answered; beyond the slots, a
	// connection is closed at once: the accept loop never waits. The
	// waiting requests are bounded apart (MaxPending), so that a flood of
	// handshakes cannot take their room, nor they the handshakes'.
	slots := make(chan struct{}, s.cfg.MaxPending+16)
	conf := &tls.Config{
		Certificates: []tls.Certificate{s.cfg.Cert},
		ClientAuth:   tls.RequireAnyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		addr := hostOf(c.RemoteAddr())
		if why := s.takeAddr(addr); why != "" {
			s.refused(refusedAddrBusy, "event=refused addr=%s err=\"busy: %s\"", addr, why)
			c.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			s.releaseAddr(addr)
			s.refused(refusedBusy, "event=refused addr=%s err=\"busy: too many connections in their handshake\"", addr)
			c.Close()
			continue
		}
		wg.Go(func() {
			var once sync.Once
			handshaken := func() { once.Do(func() { <-slots; s.releaseAddr(addr) }) }
			defer handshaken()
			defer c.Close()
			s.serveConn(ctx, tls.Server(c, conf), handshaken)
		})
	}
}

// takeAddr counts a connection in its handshake from addr, unless it has
// MaxPerAddr such, or its prefix half of all handshake slots: one
// machine's flood then leaves room for the others. It says which bound
// is reached, or "".
func (s *Server) takeAddr(addr string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := prefixOf(addr)
	switch {
	case s.perAddr[addr] >= s.cfg.MaxPerAddr:
		return fmt.Sprintf("%d connections in their handshake from this address", s.cfg.MaxPerAddr)
	case s.perPrefix[p] >= s.maxPerPrefix():
		return fmt.Sprintf("%d connections in their handshake from %s", s.maxPerPrefix(), p)
	}
	s.perAddr[addr]++
	s.perPrefix[p]++
	return ""
}

func (s *Server) releaseAddr(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perAddr[addr]--; s.perAddr[addr] <= 0 {
		delete(s.perAddr, addr)
	}
	p := prefixOf(addr)
	if s.perPrefix[p]--; s.perPrefix[p] <= 0 {
		delete(s.perPrefix, p)
	}
}

// maxPerPrefix is the bound of one prefix's connections in their
// handshake: half of all the slots (MaxPending+16), never below
// MaxPerAddr.
func (s *Server) maxPerPrefix() int { return max((s.cfg.MaxPending+16)/2, s.cfg.MaxPerAddr) }

// maxPendingPerPrefix is the bound of one prefix's waiting requests:
// half of MaxPending, never below MaxPendingPerAddr.
func (s *Server) maxPendingPerPrefix() int { return max(s.cfg.MaxPending/2, s.cfg.MaxPendingPerAddr) }

// prefixOf is the prefix addr is counted in beside itself: its /64 for
// IPv6 (one host has many addresses there, usually a whole /64), all of
// loopback as one ("local": any local user may bind any of 127.0.0.0/8),
// else the address itself: boot networks are IPv4 /24s of many nodes,
// each of which must be able to enroll.
func prefixOf(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.Unmap().WithZone("")
	switch {
	case ip.IsLoopback():
		return "local"
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return a.String()
}

// serveConn answers one request. handshaken frees the connection's
// handshake slot, once its request is read and checked.
func (s *Server) serveConn(ctx context.Context, c *tls.Conn, handshaken func()) {
	addr := hostOf(c.RemoteAddr())
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	hctx, cancel := context.WithTimeout(ctx, s.cfg.HandshakeTimeout)
	err := c.HandshakeContext(hctx)
	cancel()
	if err != nil {
		s.log.Debug("enroll: handshake failed", "addr", addr, "err", err)
		return
	}
	peer := c.ConnectionState().PeerCertificates[0].PublicKey
	fp, err := Fingerprint(peer)
	if err != nil {
		return
	}
	refuse := func(kind int, why string) {
		s.refused(kind, "event=refused fingerprint=%s addr=%s err=%q", fp, addr, why)
		writeReply(c, Reply{Status: StatusRefused, Error: why, Fingerprint: fp})
	}
	br := bufio.NewReader(io.LimitReader(c, MaxRequest+1))
	line, err := br.ReadBytes('\n')
	if err != nil {
		refuse(refusedBad, fmt.Sprintf("%v: no request line within %v and %d bytes", ErrBadRequest, s.cfg.HandshakeTimeout, MaxRequest))
		return
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		refuse(refusedBad, fmt.Sprintf("%v: %v", ErrBadRequest, err))
		return
	}
	if err := checkNode(&req); err != nil {
		refuse(refusedBad, err.Error())
		return
	}
	csr, err := checkCSR(req.CSR, peer)
	if err != nil {
		refuse(refusedBad, err.Error())
		return
	}
	c.SetDeadline(time.Time{})

	how, r, name, kind, why := s.admit(fp, addr, &req)
	if why != "" {
		refuse(kind, why)
		return
	}
	handshaken()
	if r != nil {
		defer s.forget(r)
		if !s.wait(ctx, c, r, fp) {
			return
		}
		how = "approved"
	}
	cert, err := s.cfg.NodeCA.IssueFor(csr.PublicKey, certs.Server, name, sans(name, addr), certs.Validity{})
	if err != nil {
		refuse(refusedBad, "signing the listener's certificate: "+err.Error())
		return
	}
	sec := s.cfg.Secrets
	sec.ListenerCert = certs.CertPEM(cert)
	// Enrolled before the reply goes, so that whoever reads the reply
	// finds the key in /enroll/enrolled; back to approved if it does not
	// go.
	s.mu.Lock()
	delete(s.approved, fp)
	s.enrolled[fp] = enrolledNode{name: name, mac: req.MAC, addr: addr, how: how, at: s.clk.Now()}
	s.mu.Unlock()
	s.event("event=enrolled fingerprint=%s name=%s mac=%s addr=%s by=%s", fp, name, orDash(req.MAC), addr, how)
	c.SetWriteDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := writeReply(c, Reply{Status: StatusApproved, Fingerprint: fp, Secrets: &sec}); err != nil {
		s.mu.Lock()
		delete(s.enrolled, fp)
		s.approved[fp] = true
		s.mu.Unlock()
		s.event("event=undelivered fingerprint=%s addr=%s err=%q", fp, addr, err.Error())
	}
}

// MaxName is the longest node name a request may carry, and a name the
// server gives (a DNS label's bound).
const MaxName = 63

// ValidName reports whether name is a node name: 1 to MaxName of a-z,
// 0-9, '-' and '.'. Whatever else a request carries could hold terminal
// escapes or a wildcard, and is refused.
func ValidName(name string) bool {
	if name == "" || len(name) > MaxName {
		return false
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// checkNode refuses a request whose MAC is not a MAC or whose name is not
// a node name (upper case is taken as lower: DHCP host names have it), and
// writes the MAC as net.HardwareAddr.String does. Neither value is
// repeated in the refusal: it may be an escape sequence for the
// operator's terminal.
func checkNode(req *Request) error {
	if req.MAC != "" {
		mac, err := net.ParseMAC(req.MAC)
		if err != nil {
			return fmt.Errorf("%w: the MAC is not a MAC address", ErrBadRequest)
		}
		req.MAC = mac.String()
	}
	req.Name = strings.ToLower(req.Name)
	if req.Name != "" && !ValidName(req.Name) {
		return fmt.Errorf("%w: the name is not a host name (a-z, 0-9, '-' and '.', at most %d)", ErrBadRequest, MaxName)
	}
	return nil
}

// nodeName is the name the server issues the listener's certificate for,
// whatever name the request carries: the name a spent code was given
// for, the one Config.NodeNames has for the MAC, else pxe- and the MAC
// (pxe- and the fingerprint's start without a MAC).
func (s *Server) nodeName(mac, fp string, code *Code) string {
	if code != nil && ValidName(code.For) {
		if _, err := net.ParseMAC(code.For); err != nil {
			return code.For
		}
	}
	if n := s.cfg.NodeNames[mac]; n != "" {
		return n
	}
	if mac != "" {
		return "pxe-" + strings.ReplaceAll(mac, ":", "-")
	}
	return "pxe-" + fp[len("sha256:"):len("sha256:")+16]
}

// sans are the listener certificate's names: the node's name and the
// address its request came from, nothing the node chose.
func sans(name, addr string) []string {
	if net.ParseIP(addr) == nil || addr == name {
		return []string{name}
	}
	return []string{name, addr}
}

// admit decides what becomes of a request: delivered at once (how says
// why), refused (kind and why), or waiting (r); name is the name its
// certificate is issued for.
func (s *Server) admit(fp, addr string, req *Request) (how string, r *request, name string, kind int, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.enrolled[fp].how != "":
		return "", nil, "", refusedKey, "already enrolled: a key is served once; reboot the node for a new key"
	case s.denied[fp]:
		return "", nil, "", refusedKey, "denied"
	case req.Code != "":
		now, p := s.clk.Now(), prefixOf(addr)
		if f := s.codeFails[p]; f != nil && now.Before(f.until) {
			return "", nil, "", refusedCode, fmt.Sprintf("too many wrong codes from %s: try again in %v", p, f.until.Sub(now).Round(time.Second))
		}
		if c := s.spend(req); c != nil {
			delete(s.codeFails, p)
			name = s.nodeName(req.MAC, fp, c)
			s.event("event=code fingerprint=%s for=%s name=%s mac=%s addr=%s", fp, c.For, name, orDash(req.MAC), addr)
			return "code", nil, name, 0, ""
		}
		// The code itself is never logged.
		s.codeFailed(p, now)
		return "", nil, "", refusedCode, "invalid code: unknown, spent, expired or given for another node"
	case s.approved[fp]:
		return "approved", nil, s.nodeName(req.MAC, fp, nil), 0, ""
	case s.pending[fp] != nil:
		return "", nil, "", refusedBusy, "busy: a request from this key waits already"
	case len(s.pending) >= s.cfg.MaxPending:
		return "", nil, "", refusedBusy, fmt.Sprintf("busy: %d requests wait already", len(s.pending))
	case s.pendingAddr[addr] >= s.cfg.MaxPendingPerAddr:
		return "", nil, "", refusedBusy, fmt.Sprintf("busy: %d requests from this address wait already", s.pendingAddr[addr])
	case s.pendingPrefix[prefixOf(addr)] >= s.maxPendingPerPrefix():
		return "", nil, "", refusedBusy, fmt.Sprintf("busy: %d requests from %s wait already", s.pendingPrefix[prefixOf(addr)], prefixOf(addr))
	}
	name = s.nodeName(req.MAC, fp, nil)
	r = &request{fp: fp, name: name, requested: req.Name, mac: req.MAC, addr: addr, since: s.clk.Now(), verdict: make(chan bool, 1)}
	s.pending[fp] = r
	s.pendingAddr[addr]++
	s.pendingPrefix[prefixOf(addr)]++
	s.event("event=pending fingerprint=%s name=%s requested=%s mac=%s addr=%s", fp, name, orDash(req.Name), orDash(req.MAC), addr)
	return "", r, name, 0, ""
}

// spend finds the code req carries for its MAC or name and spends it.
// Every code is compared, in constant time, so that the time taken says
// nothing about which part matched.
func (s *Server) spend(req *Request) *Code {
	got := []byte(normalCode(req.Code))
	now := s.clk.Now()
	var found *Code
	for i, c := range s.codes {
		if subtle.ConstantTimeCompare(got, []byte(c.Code)) == 1 {
			if (strings.EqualFold(c.For, req.MAC) || c.For == req.Name) && now.Before(c.Expires) {
				found = c
			}
			// A matching code is spent whatever else: one try.
			s.codes = slices.Delete(s.codes, i, i+1)
			break
		}
	}
	return found
}

// forget drops a request that ended without a verdict, and counts its
// connection out of its address's waiting ones.
func (s *Server) forget(r *request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pendingAddr[r.addr]--; s.pendingAddr[r.addr] <= 0 {
		delete(s.pendingAddr, r.addr)
	}
	p := prefixOf(r.addr)
	if s.pendingPrefix[p]--; s.pendingPrefix[p] <= 0 {
		delete(s.pendingPrefix, p)
	}
	if s.pending[r.fp] == r {
		delete(s.pending, r.fp)
		s.event("event=gone fingerprint=%s addr=%s", r.fp, r.addr)
	}
}

// wait tells the node its request waits, and waits for the verdict, the
// node going away, MaxWait, or ctx.
func (s *Server) wait(ctx context.Context, c *tls.Conn, r *request, fp string) bool {
	if err := writeReply(c, Reply{Status: StatusPending, Fingerprint: fp}); err != nil {
		return false
	}
	gone := make(chan struct{})
	go func() {
		// The node sends nothing more: a read returns when it goes away.
		var b [1]byte
		c.Read(b[:])
		close(gone)
	}()
	defer func() { c.SetReadDeadline(time.Now()); <-gone; c.SetReadDeadline(time.Time{}) }()
	expired := make(chan struct{})
	t := s.clk.AfterFunc(s.cfg.MaxWait, func() { close(expired) })
	defer t.Stop()
	select {
	case ok := <-r.verdict:
		if !ok {
			writeReply(c, Reply{Status: StatusRefused, Error: "denied", Fingerprint: fp})
		}
		return ok
	case <-gone:
	case <-expired:
		writeReply(c, Reply{Status: StatusRefused, Error: fmt.Sprintf("not approved within %v", s.cfg.MaxWait), Fingerprint: fp})
	case <-ctx.Done():
		writeReply(c, Reply{Status: StatusRefused, Error: "the enrollment server stops", Fingerprint: fp})
	}
	return false
}

func writeReply(w io.Writer, r Reply) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
