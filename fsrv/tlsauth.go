package fsrv

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// Who may use a TLS listener besides holding a certificate from its CA
// (DESIGN 7.7): a rules file per listener (",clients=FILE") names the
// certificates it takes and gives each a role, read-only or read-write;
// a deny list (serve's --tls-deny) refuses certificates by serial or
// fingerprint on every TLS listener. Both, with the certificates and
// CAs, are read again by Listeners.Reload (serve on SIGHUP).

var (
	// ErrDenied refuses a client certificate on the deny list.
	ErrDenied = errors.New("client certificate on the deny list")
	// ErrNotListed refuses a client certificate that the listener's
	// rules file does not name.
	ErrNotListed = errors.New("client certificate not in the listener's rules")
)

// Fingerprint is the SHA-256 of a certificate's DER, as the rules file
// and the deny list name certificates (openssl x509 -fingerprint
// -sha256 prints it with colons, which both files accept).
type Fingerprint [sha256.Size]byte

func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// FingerprintOf is c's Fingerprint.
func FingerprintOf(c *x509.Certificate) Fingerprint { return sha256.Sum256(c.Raw) }

// Serial is a certificate's serial number as the audit line and the deny
// list write it: upper-case hexadecimal in whole bytes, as openssl x509
// -serial prints it.
func Serial(c *x509.Certificate) string { return serialText(c.SerialNumber) }

func serialText(n *big.Int) string {
	s := strings.ToUpper(n.Text(16))
	if len(s)%2 == 1 {
		s = "0" + s
	}
	return s
}

// Rules are a TLS listener's clients file: one line per certificate,
// `CN|fingerprint ro|rw`; '#' starts a comment. A certificate takes the
// role of the line that names its fingerprint, else of the line that
// names its subject's CN; one named by no line is refused (ErrNotListed).
type Rules struct {
	byFingerprint map[Fingerprint]bool // read-only?
	byCN          map[string]bool
}

// ParseRules reads a rules file; an error names the file and the line.
func ParseRules(r io.Reader, file string) (*Rules, error) {
	rs := &Rules{byFingerprint: map[Fingerprint]bool{}, byCN: map[string]bool{}}
	err := eachLine(r, file, func(line string) error {
		i := strings.LastIndexAny(line, " \t")
		if i < 0 {
			return fmt.Errorf("%q: want `CN|fingerprint ro|rw`", line)
		}
		who, role := strings.TrimSpace(line[:i]), line[i+1:]
		var ro bool
		switch role {
		case "ro":
			ro = true
		case "rw":
		default:
			return fmt.Errorf("%q: role %q: want ro or rw", line, role)
		}
		if fp, ok := parseFingerprint(who); ok {
			rs.byFingerprint[fp] = ro
		} else {
			rs.byCN[who] = ro
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// ReadOnly reports the role of c, and false for ok when no line names
// it.
func (rs *Rules) ReadOnly(c *x509.Certificate) (ro, ok bool) {
	if ro, ok := rs.byFingerprint[FingerprintOf(c)]; ok {
		return ro, true
	}
	ro, ok = rs.byCN[c.Subject.CommonName]
	return ro, ok
}

// DenyList refuses certificates by serial number or fingerprint, one a
// line: a SHA-256 fingerprint (64 hexadecimal digits, colons allowed, as
// `sha256 Fingerprint=...` or `sha256:...` too), or a serial in
// hexadecimal (colons allowed, as `serial=...` too). '#' starts a
// comment.
type DenyList struct {
	serials      map[string]struct{}
	fingerprints map[Fingerprint]struct{}
}

// ParseDenyList reads a deny list; an error names the file and the line.
func ParseDenyList(r io.Reader, file string) (*DenyList, error) {
	d := &DenyList{serials: map[string]struct{}{}, fingerprints: map[Fingerprint]struct{}{}}
	err := eachLine(r, file, func(line string) error {
		if fp, ok := parseFingerprint(line); ok {
			d.fingerprints[fp] = struct{}{}
			return nil
		}
		s := line
		for _, p := range []string{"serial=", "serial:", "serial "} {
			if len(s) > len(p) && strings.EqualFold(s[:len(p)], p) {
				s = strings.TrimSpace(s[len(p):])
			}
		}
		s = strings.ReplaceAll(s, ":", "")
		if len(s)%2 == 1 {
			s = "0" + s
		}
		b, err := hex.DecodeString(s)
		if err != nil || len(b) == 0 || len(b) > 20 {
			return fmt.Errorf("%q: want a serial in hexadecimal (at most 20 bytes) or a SHA-256 fingerprint", line)
		}
		d.serials[serialText(new(big.Int).SetBytes(b))] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Denies reports whether c is on the list.
func (d *DenyList) Denies(c *x509.Certificate) bool {
	if d == nil {
		return false
	}
	if _, ok := d.fingerprints[FingerprintOf(c)]; ok {
		return true
	}
	_, ok := d.serials[Serial(c)]
	return ok
}

// parseFingerprint takes a SHA-256 fingerprint in the forms openssl and
// others print.
func parseFingerprint(s string) (Fingerprint, bool) {
	var fp Fingerprint
	if strings.HasPrefix(strings.ToLower(s), "sha256") {
		if j := strings.IndexAny(s, "=:"); j >= 0 {
			s = s[j+1:]
		}
	}
	b, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	if err != nil || len(b) != len(fp) {
		return fp, false
	}
	copy(fp[:], b)
	return fp, true
}

// eachLine calls f with every line of r that is not blank or a comment,
// trimmed, and names the file and line in its error.
func eachLine(r io.Reader, file string, f func(string) error) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if err := f(line); err != nil {
			return fmt.Errorf("%s:%d: %w", file, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

func readRules(file string) (*Rules, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("clients=%s: %w", file, err)
	}
	return ParseRules(bytes.NewReader(b), file)
}

// ReadDenyList reads a deny list file.
func ReadDenyList(file string) (*DenyList, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--tls-deny: %w", err)
	}
	return ParseDenyList(bytes.NewReader(b), file)
}

// tlsPolicy is what one TLS listener serves with, as read at one time:
// its configuration, rules and deny list. A reload makes a new one.
type tlsPolicy struct {
	conf  *tls.Config
	rules *Rules // nil: every certificate from the CA, with the listener's role
	deny  *DenyList
}

// newTLSPolicy completes conf for a TLS listener: TLS 1.3, a client
// certificate that chains to conf.ClientCAs, and the deny list and
// rules checked in the handshake, so that a refused client hears it
// there (a bad_certificate alert) and holds no 9P session.
func newTLSPolicy(conf *tls.Config, rules *Rules, deny *DenyList) *tlsPolicy {
	conf = conf.Clone()
	conf.MinVersion = tls.VersionTLS13
	conf.ClientAuth = tls.RequireAndVerifyClientCert
	p := &tlsPolicy{conf: conf, rules: rules, deny: deny}
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return nil // RequireAndVerifyClientCert refused it already
		}
		c := cs.PeerCertificates[0]
		if deny.Denies(c) {
			return fmt.Errorf("%w: %s serial %s", ErrDenied, certName(c), Serial(c))
		}
		if rules != nil {
			if _, ok := rules.ReadOnly(c); !ok {
				return fmt.Errorf("%w: %s fingerprint %s", ErrNotListed, certName(c), FingerprintOf(c))
			}
		}
		return nil
	}
	return p
}

// readOnly is the role the rules give c (false without rules: the
// listener's own role holds).
func (p *tlsPolicy) readOnly(c *x509.Certificate) bool {
	if p.rules == nil || c == nil {
		return false
	}
	ro, _ := p.rules.ReadOnly(c)
	return ro
}

// tlsAuth holds a TLS listener's current policy and what it is read
// from.
type tlsAuth struct {
	cur   atomic.Pointer[tlsPolicy]
	files TLSFiles
	la    ListenAddr

	// wmu guards watchers, called after each reload: the connections
	// served through this listener, which recheck their certificate.
	wmu      sync.Mutex
	watchers map[*conn]func()
}

// watch calls f after each reload until the returned stop is called.
func (a *tlsAuth) watch(c *conn, f func()) (stop func()) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if a.watchers == nil {
		a.watchers = make(map[*conn]func())
	}
	a.watchers[c] = f
	return func() {
		a.wmu.Lock()
		defer a.wmu.Unlock()
		delete(a.watchers, c)
	}
}

// reloaded tells the connections served through the listener that its
// policy changed.
func (a *tlsAuth) reloaded() {
	a.wmu.Lock()
	fs := make([]func(), 0, len(a.watchers))
	for _, f := range a.watchers {
		fs = append(fs, f)
	}
	a.wmu.Unlock()
	for _, f := range fs {
		f()
	}
}

// stillAllows reports whether the listener's current policy serves c as
// it was served (read-only or not), and why not.
func (a *tlsAuth) stillAllows(c *x509.Certificate, ro bool) (bool, string) {
	pol := a.cur.Load()
	if pol.deny.Denies(c) {
		return false, "on the deny list"
	}
	if pol.rules != nil {
		rulesRO, ok := pol.rules.ReadOnly(c)
		if !ok {
			return false, "no longer in the listener's clients file"
		}
		if rulesRO && !ro {
			return false, "read-only now"
		}
	}
	return true, ""
}

func staticAuth(conf *tls.Config) *tlsAuth {
	a := &tlsAuth{}
	a.cur.Store(newTLSPolicy(conf, nil, nil))
	return a
}

// load reads a's files: the server certificate and key, the client CA
// (the listener's ca=, else ClientCA), its rules (clients=) and the deny
// list. Every error names the file, and the line for rules and deny list.
func (a *tlsAuth) load() (*tlsPolicy, *x509.Certificate, error) {
	ca := a.la.CA
	if ca == "" {
		ca = a.files.ClientCA
	}
	if a.files.Cert == "" || a.files.Key == "" || ca == "" {
		return nil, nil, fmt.Errorf("a tls listener needs --tls-cert, --tls-key and --tls-client-ca or ,ca=FILE (shardfs certs makes them)")
	}
	conf, err := ServerTLSConfig(a.files.Cert, a.files.Key, ca)
	if err != nil {
		return nil, nil, err
	}
	var rules *Rules
	if a.la.Clients != "" {
		if rules, err = readRules(a.la.Clients); err != nil {
			return nil, nil, err
		}
	}
	var deny *DenyList
	if a.files.Deny != "" {
		if deny, err = ReadDenyList(a.files.Deny); err != nil {
			return nil, nil, err
		}
	}
	return newTLSPolicy(conf, rules, deny), conf.Certificates[0].Leaf, nil
}
