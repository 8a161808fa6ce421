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
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/journal"
)

// Defaults of Config's bounds.
const (
	DefaultMaxPending       = 64
	DefaultMaxWait          = time.Hour
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultCodeTTL          = time.Hour
	DefaultMaxPerAddr       = 8
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
	// NodeNames are added to every listener certificate's names.
	NodeNames []string
	// Secrets are what every approved node gets (ListenerCert is made per
	// node).
	Secrets Secrets
	// Codes are the one-time codes.
	Codes []Code
	// MaxPending, MaxWait and HandshakeTimeout bound the requests, and
	// MaxPerAddr the connections from one address (the Default values
	// when zero).
	MaxPending       int
	MaxPerAddr       int
	MaxWait          time.Duration
	HandshakeTimeout time.Duration
	Clock            clock.Clock
	Logger           *slog.Logger
}

// Server is the enrollment server.
type Server struct {
	cfg    Config
	clk    clock.Clock
	log    *slog.Logger
	events *journal.Log
	tree   *fsrv.Dir

	mu       sync.Mutex
	pending  map[string]*request // by fingerprint
	approved map[string]bool     // approved, not yet delivered
	denied   map[string]bool
	enrolled map[string]enrolledNode
	codes    []*Code
	perAddr  map[string]int // open connections by remote address
}

// request is a waiting request.
type request struct {
	fp, name, mac, addr string
	since               time.Time
	verdict             chan bool // true: approved; buffered, sent once
}

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
	s := &Server{cfg: cfg, clk: clock.Or(cfg.Clock), log: cfg.Logger, events: journal.New(1 << 20),
		pending: map[string]*request{}, approved: map[string]bool{}, denied: map[string]bool{}, enrolled: map[string]enrolledNode{}, perAddr: map[string]int{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, c := range cfg.Codes {
		if len(normalCode(c.Code)) < MinCodeLen {
			return nil, fmt.Errorf("enroll: the code for %s is shorter than %d characters", c.For, MinCodeLen)
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
// fingerprint mac addr since), enrolled (fingerprint name mac addr how
// at), ctl (approve FINGERPRINT, deny FINGERPRINT) and events.
func (s *Server) Dir() *fsrv.Dir { return s.tree }

func (s *Server) event(format string, args ...any) {
	line := fmt.Sprintf("ts=%s ", s.clk.Now().UTC().Format("2006-01-02T15:04:05.000Z")) + fmt.Sprintf(format, args...) + "\n"
	s.events.Append([]byte(line), s.clk.Now())
	s.log.Info("enroll: " + strings.TrimSpace(line[strings.IndexByte(line, ' ')+1:]))
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
		fmt.Fprintf(&b, "%s %s %s %s\n", r.fp, orDash(r.mac), r.addr, r.since.UTC().Format(time.RFC3339))
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
	s.event("event=approved fingerprint=%s mac=%s addr=%s", fp, orDash(r.mac), r.addr)
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
	// Connections beyond the pending bound, plus room for those still in
	// their handshake, are closed at once: the accept loop never waits.
	slots := make(chan struct{}, 2*s.cfg.MaxPending+16)
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
		if !s.takeAddr(addr) {
			s.event("event=refused addr=%s err=\"busy: %d connections from this address\"", addr, s.cfg.MaxPerAddr)
			c.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			s.releaseAddr(addr)
			s.event("event=refused addr=%s err=\"busy: too many connections\"", addr)
			c.Close()
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			defer s.releaseAddr(addr)
			defer c.Close()
			s.serveConn(ctx, tls.Server(c, conf))
		})
	}
}

// takeAddr counts a connection from addr, unless it has MaxPerAddr open:
// one machine's flood then leaves room for the others.
func (s *Server) takeAddr(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perAddr[addr] >= s.cfg.MaxPerAddr {
		return false
	}
	s.perAddr[addr]++
	return true
}

func (s *Server) releaseAddr(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perAddr[addr]--; s.perAddr[addr] <= 0 {
		delete(s.perAddr, addr)
	}
}

func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	return a.String()
}

// serveConn answers one request.
func (s *Server) serveConn(ctx context.Context, c *tls.Conn) {
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
	refuse := func(why string) {
		s.event("event=refused fingerprint=%s addr=%s err=%q", fp, addr, why)
		writeReply(c, Reply{Status: StatusRefused, Error: why, Fingerprint: fp})
	}
	br := bufio.NewReader(io.LimitReader(c, MaxRequest+1))
	line, err := br.ReadBytes('\n')
	if err != nil {
		refuse(fmt.Sprintf("%v: no request line within %v and %d bytes", ErrBadRequest, s.cfg.HandshakeTimeout, MaxRequest))
		return
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		refuse(fmt.Sprintf("%v: %v", ErrBadRequest, err))
		return
	}
	csr, err := checkCSR(req.CSR, peer)
	if err != nil {
		refuse(err.Error())
		return
	}
	c.SetDeadline(time.Time{})

	how, r, why := s.admit(fp, addr, &req)
	if why != "" {
		refuse(why)
		return
	}
	if r != nil {
		defer s.forget(r)
		if !s.wait(ctx, c, r, fp) {
			return
		}
		how = "approved"
	}
	cert, err := s.cfg.NodeCA.IssueFor(csr.PublicKey, certs.Server, nodeName(&req, fp), s.names(&req), certs.Validity{})
	if err != nil {
		refuse("signing the listener's certificate: " + err.Error())
		return
	}
	sec := s.cfg.Secrets
	sec.ListenerCert = certs.CertPEM(cert)
	// Enrolled before the reply goes, so that whoever reads the reply
	// finds the key in /enroll/enrolled; back to approved if it does not
	// go.
	s.mu.Lock()
	delete(s.approved, fp)
	s.enrolled[fp] = enrolledNode{name: req.Name, mac: req.MAC, addr: addr, how: how, at: s.clk.Now()}
	s.mu.Unlock()
	s.event("event=enrolled fingerprint=%s name=%s mac=%s addr=%s by=%s", fp, orDash(req.Name), orDash(req.MAC), addr, how)
	c.SetWriteDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := writeReply(c, Reply{Status: StatusApproved, Fingerprint: fp, Secrets: &sec}); err != nil {
		s.mu.Lock()
		delete(s.enrolled, fp)
		s.approved[fp] = true
		s.mu.Unlock()
		s.event("event=undelivered fingerprint=%s addr=%s err=%q", fp, addr, err.Error())
	}
}

func nodeName(req *Request, fp string) string {
	if req.Name != "" {
		return req.Name
	}
	return "pxe-" + fp[len("sha256:"):len("sha256:")+16]
}

// names are the listener certificate's names: the node's name, its
// addresses, and Config.NodeNames.
func (s *Server) names(req *Request) []string {
	var names []string
	if req.Name != "" {
		names = append(names, req.Name)
	}
	for _, a := range req.Addrs {
		if net.ParseIP(a) != nil {
			names = append(names, a)
		}
	}
	names = append(names, s.cfg.NodeNames...)
	slices.Sort(names)
	return slices.Compact(names)
}

// admit decides what becomes of a request: delivered at once (how says
// why), refused (why), or waiting (r).
func (s *Server) admit(fp, addr string, req *Request) (how string, r *request, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.enrolled[fp].how != "":
		return "", nil, "already enrolled: a key is served once; reboot the node for a new key"
	case s.denied[fp]:
		return "", nil, "denied"
	case req.Code != "":
		if c := s.spend(req); c != nil {
			s.event("event=code fingerprint=%s for=%s mac=%s addr=%s", fp, c.For, orDash(req.MAC), addr)
			return "code", nil, ""
		}
		// The code itself is never logged.
		return "", nil, "invalid code: unknown, spent, expired or given for another node"
	case s.approved[fp]:
		return "approved", nil, ""
	case s.pending[fp] != nil:
		return "", nil, "busy: a request from this key waits already"
	case len(s.pending) >= s.cfg.MaxPending:
		return "", nil, fmt.Sprintf("busy: %d requests wait already", len(s.pending))
	}
	r = &request{fp: fp, name: req.Name, mac: req.MAC, addr: addr, since: s.clk.Now(), verdict: make(chan bool, 1)}
	s.pending[fp] = r
	s.event("event=pending fingerprint=%s name=%s mac=%s addr=%s", fp, orDash(req.Name), orDash(req.MAC), addr)
	return "", r, ""
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

// forget drops a request that ended without a verdict.
func (s *Server) forget(r *request) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
