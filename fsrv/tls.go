package fsrv

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// ErrNoTLSConfig is returned by Listen for a tls! address: a TLS listener
// needs a certificate, its key and the CA of the client certificates.
var ErrNoTLSConfig = errors.New("a tls listener needs a server certificate, its key and the CA that signs client certificates")

// DefaultHandshakeTimeout bounds a TLS handshake when
// Server.HandshakeTimeout is zero.
const DefaultHandshakeTimeout = 10 * time.Second

// ServerTLSConfig loads a TLS listener's configuration: the server's
// certificate and key (PEM) and the CA certificates (PEM) that client
// certificates must chain to. Every error names the file.
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || clientCAFile == "" {
		return nil, ErrNoTLSConfig
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("fsrv: server certificate %s, key %s: %w", certFile, keyFile, err)
	}
	pool, err := loadPool(clientCAFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool}, nil
}

// ClientTLSConfig loads a client's configuration: its certificate and key
// (PEM; both empty means none, which a shardfs server refuses) and the CA
// (PEM) the server's certificate must chain to. Every error names the
// file.
func ClientTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, errors.New("fsrv: a tls! address needs the CA that signed the server's certificate")
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, errors.New("fsrv: a client certificate needs both its certificate and its key")
	default:
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("fsrv: client certificate %s, key %s: %w", certFile, keyFile, err)
		}
		// Sent whatever CAs the server names: a certificate from
		// another CA is then refused by the server with that reason,
		// where Go's default would send none and the refusal would
		// say "no client certificate".
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return conf, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("fsrv: CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("fsrv: CA certificates %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// TLSListener returns a listener whose connections are TLS servers with
// conf, held to TLS 1.3 and to a client certificate that chains to
// conf.ClientCAs (which must be set). Server.Serve completes each
// handshake in the connection's own goroutine within
// Server.HandshakeTimeout, so that a client stalling it holds nothing
// else up.
func TLSListener(l net.Listener, conf *tls.Config) net.Listener {
	return tlsListener{l, staticAuth(conf)}
}

// IsTLS reports whether l is a TLS listener (ListenTLS's tls!, or
// TLSListener's), read-only or not.
func IsTLS(l net.Listener) bool {
	for ; l != nil; l = inner(l) {
		if _, ok := l.(tlsListener); ok {
			return true
		}
	}
	return false
}

type tlsListener struct {
	net.Listener
	auth *tlsAuth
}

// Accept returns the connection still raw: Server.Serve looks at its
// first bytes and runs the handshake (see Server.handshake).
func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &pendingTLS{Conn: c, auth: l.auth}, nil
}

// pendingTLS is an accepted connection of a TLS listener before its
// handshake.
type pendingTLS struct {
	net.Conn
	auth *tlsAuth
}

// peekedConn reads through the buffer that looked at its first bytes.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Dial connects to addr (see ParseAddr). A tls!host!port address is
// dialled with conf, whose ServerName defaults to host, and the handshake
// is completed; its error says what failed, in an operator's words (see
// ExplainTLS).
func Dial(ctx context.Context, addr string, conf *tls.Config) (net.Conn, error) {
	network, address, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	if network != "tls" {
		return d.DialContext(ctx, network, address)
	}
	if conf == nil {
		return nil, fmt.Errorf("fsrv: dial %s: %w", addr, errors.New("a tls! address needs the server's CA and a client certificate"))
	}
	conf = conf.Clone()
	conf.MinVersion = tls.VersionTLS13
	if conf.ServerName == "" {
		conf.ServerName, _, _ = net.SplitHostPort(address)
	}
	td := tls.Dialer{NetDialer: &d, Config: conf}
	c, err := td.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("fsrv: dial %s: %w", addr, ExplainTLS(err, conf.ServerName))
	}
	return &clientConn{Conn: c.(*tls.Conn), serverName: conf.ServerName}, nil
}

// clientConn explains its errors (ExplainTLS). Under TLS 1.3 a server
// refuses a client certificate after the client's handshake is done: the
// alert is waiting to be read when the client's first write fails on the
// closed connection, so a failed write reads it.
type clientConn struct {
	*tls.Conn
	serverName string
}

func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && err != io.EOF {
		err = ExplainTLS(err, c.serverName)
	}
	return n, err
}

func (c *clientConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil {
		return n, nil
	}
	// The connection is lost: what the read takes is the alert or nothing.
	c.Conn.SetReadDeadline(time.Now().Add(time.Second))
	var b [1]byte
	if _, rerr := c.Conn.Read(b[:]); rerr != nil && strings.Contains(rerr.Error(), "remote error: tls:") {
		return n, ExplainTLS(rerr, c.serverName)
	}
	return n, ExplainTLS(err, c.serverName)
}

// ExplainTLS rewrites a client's TLS error in words that say what failed:
// the server's certificate is for another name, signed by another CA,
// expired or not yet valid; or the server refused our certificate (none,
// another CA, expired). Under TLS 1.3 the server's refusal of a client
// certificate arrives after the client's handshake completed, at the
// first read, so a client passes that read's error here too. Other errors
// are returned as they are.
func ExplainTLS(err error, serverName string) error {
	if err == nil {
		return nil
	}
	if cv, ok := errors.AsType[*tls.CertificateVerificationError](err); ok && len(cv.UnverifiedCertificates) > 0 {
		c := cv.UnverifiedCertificates[0]
		switch why := cv.Err; {
		case isType[x509.HostnameError](why):
			return fmt.Errorf("the server's certificate (%s) is for another name: it names %s, not %q; dial a name it carries, or reissue it: %w", certName(c), certNames(c), serverName, err)
		case isType[x509.UnknownAuthorityError](why):
			return fmt.Errorf("the server's certificate (%s, issued by %q) is signed by another CA than the one given (--ca): %w", certName(c), c.Issuer.CommonName, err)
		case isInvalid(why, x509.Expired):
			return fmt.Errorf("the server's certificate (%s) %s: %w", certName(c), validity(c, time.Now()), err)
		}
		return fmt.Errorf("the server's certificate (%s) is not valid: %w", certName(c), err)
	}
	msg := err.Error()
	if strings.Contains(msg, "remote error: tls: user canceled") {
		return fmt.Errorf("%w: the server refused the connection before the TLS handshake; try again later (%v)", ErrServerFull, err)
	}
	for _, r := range []struct{ alert, says string }{
		{"tls: certificate required", "the server requires a client certificate (--cert and --key)"},
		{"tls: unknown certificate authority", "the server refused our client certificate: it is signed by a CA the server does not trust"},
		{"tls: expired certificate", "the server refused our client certificate: expired or not yet valid (by the server's clock)"},
		{"tls: bad certificate", "the server refused our client certificate"},
		{"tls: protocol version not supported", "the server speaks TLS 1.3 only"},
	} {
		if strings.Contains(msg, "remote error: "+r.alert) {
			return fmt.Errorf("%s: %w", r.says, err)
		}
	}
	return err
}

func isType[T error](err error) bool {
	_, ok := errors.AsType[T](err)
	return ok
}

func isInvalid(err error, r x509.InvalidReason) bool {
	e, ok := errors.AsType[x509.CertificateInvalidError](err)
	return ok && e.Reason == r
}

func certName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return "CN=" + c.Subject.CommonName
	}
	return "serial " + c.SerialNumber.String()
}

func certNames(c *x509.Certificate) string {
	var ns []string
	ns = append(ns, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		ns = append(ns, ip.String())
	}
	if len(ns) == 0 {
		return "no name"
	}
	return strings.Join(ns, ", ")
}

// validity says how a certificate's validity misses now.
func validity(c *x509.Certificate, now time.Time) string {
	if now.Before(c.NotBefore) {
		return fmt.Sprintf("is not valid before %s, and this machine's clock says %s", c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("expired at %s", c.NotAfter.UTC().Format(time.RFC3339))
}

// recordTypeHandshake starts every TLS ClientHello record.
const recordTypeHandshake = 0x16

// whyNotTLS describes a first record header that is not a TLS handshake:
// Go's TLS server would take a 9P Tversion of 21 bytes ("9P2000.L") for an
// alert record and wait for 100 bytes more, so the server looks first.
func whyNotTLS(hdr []byte) refusal {
	// A 9P message starts with its size[4] and type[1]; Tversion is 100.
	if size := binary.LittleEndian.Uint32(hdr); hdr[4] == msgTversion && size >= 19 && size <= maxVersionFrame {
		return refusal{"plain 9P on the TLS port (a Tversion where a TLS ClientHello belongs)", "connect with tls! and a client certificate"}
	}
	return refusal{"not a TLS client", fmt.Sprintf("first bytes %x", hdr)}
}

// refusal is why the server refused a TLS client, for its log line.
type refusal struct {
	reason string // a fixed phrase: the rate limit counts per reason
	detail string // about this client's certificate, or the error
}

// whyRefused describes a failed server-side handshake.
func whyRefused(err error, now time.Time) refusal {
	if rh, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return whyNotTLS(rh.RecordHeader[:])
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return refusal{"TLS handshake timed out", err.Error()}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) {
		return refusal{"client left during the TLS handshake", err.Error()}
	}
	switch {
	case errors.Is(err, ErrDenied):
		return refusal{"client certificate on the deny list", err.Error()}
	case errors.Is(err, ErrNotListed):
		return refusal{"client certificate not in the listener's rules", err.Error()}
	}
	if cv, ok := errors.AsType[*tls.CertificateVerificationError](err); ok && len(cv.UnverifiedCertificates) > 0 {
		c := cv.UnverifiedCertificates[0]
		switch why := cv.Err; {
		case isType[x509.UnknownAuthorityError](why):
			return refusal{"client certificate signed by another CA", fmt.Sprintf("%s issued by %q", certName(c), c.Issuer.CommonName)}
		case isInvalid(why, x509.Expired):
			if now.Before(c.NotBefore) {
				return refusal{"client certificate not yet valid", certName(c) + " " + validity(c, now)}
			}
			return refusal{"client certificate expired", certName(c) + " " + validity(c, now)}
		case isInvalid(why, x509.IncompatibleUsage):
			return refusal{"client certificate not for client authentication", certName(c) + " lacks the clientAuth extended key usage"}
		}
		return refusal{"client certificate not valid", certName(c) + ": " + cv.Err.Error()}
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "remote error: tls:"):
		return refusal{"the client refused the server's certificate", msg + " (check the server certificate's names and CA against what the client dials and trusts)"}
	case strings.Contains(msg, "didn't provide a certificate"):
		return refusal{"no client certificate", "the tree's TLS listeners require one"}
	case strings.Contains(msg, "unsupported versions"), strings.Contains(msg, "protocol version"):
		return refusal{"TLS version below 1.3", msg}
	}
	return refusal{"TLS handshake failed", msg}
}

// handshake looks at a TLS listener's connection's first bytes and
// completes its handshake, all within HandshakeTimeout, with the
// listener's policy of the moment, and returns the TLS connection and
// whether the listener's rules make its certificate read-only, or nil
// when it was refused. A refusal is logged, at most once a minute for
// each reason (with the count refused since the last line for that
// reason).
func (s *Server) handshake(ctx context.Context, p *pendingTLS) (net.Conn, bool) {
	pol := p.auth.cur.Load()
	remote := p.RemoteAddr().String()
	timeout := s.handshakeTimeout()
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(hctx, func() { p.SetDeadline(time.Unix(1, 0)) })
	br := bufio.NewReaderSize(p.Conn, 16)
	hdr, err := br.Peek(5)
	var tc *tls.Conn
	switch {
	case err != nil:
	case hdr[0] != recordTypeHandshake:
		stop()
		p.Close()
		s.logRefusal(whyNotTLS(hdr), remote)
		return nil, false
	default:
		tc = tls.Server(&peekedConn{p.Conn, br}, pol.conf)
		err = tc.HandshakeContext(hctx)
	}
	if !stop() || ctx.Err() != nil {
		p.Close()
		if ctx.Err() != nil {
			return nil, false
		}
		err = fmt.Errorf("no handshake within %v: %w", timeout, os.ErrDeadlineExceeded)
	}
	if err != nil {
		p.Close()
		s.logRefusal(whyRefused(err, time.Now()), remote)
		return nil, false
	}
	ro := false
	if st := tc.ConnectionState(); len(st.PeerCertificates) > 0 {
		c := st.PeerCertificates[0]
		ro = pol.readOnly(c)
		role := "rw"
		if ro {
			role = "ro"
		}
		s.logger().Info("fsrv: TLS client", "remote", remote, "client", certName(c), "serial", Serial(c), "role", role)
	}
	return tc, ro
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout <= 0 {
		return DefaultHandshakeTimeout
	}
	return s.HandshakeTimeout
}

// refusalCount is the rate limit of one refusal reason.
type refusalCount struct {
	at      time.Time
	skipped int
}

// rateLimit tells whether a refusal of this reason may be logged now (at
// most once a minute for each reason), and how many were not logged since
// the last line.
func (s *Server) rateLimit(reason string) (skipped int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusals == nil {
		s.refusals = make(map[string]*refusalCount)
	}
	rc := s.refusals[reason]
	if rc == nil {
		rc = &refusalCount{}
		s.refusals[reason] = rc
	}
	now := s.now()
	if !rc.at.IsZero() && now.Sub(rc.at) < time.Minute {
		rc.skipped++
		return 0, false
	}
	skipped = rc.skipped
	rc.at, rc.skipped = now, 0
	return skipped, true
}

func (s *Server) logRefusal(r refusal, remote string) {
	skipped, ok := s.rateLimit(r.reason)
	if !ok {
		return
	}
	args := []any{"reason", r.reason, "remote", remote, "detail", r.detail}
	if skipped > 0 {
		args = append(args, "more_refused", skipped)
	}
	s.logger().Warn("fsrv: TLS connection refused", args...)
}
