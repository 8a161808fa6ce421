package fsrv

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TLSFiles are the files a tls! listener serves with (serve's --tls-cert,
// --tls-key and --tls-client-ca; a listener's ,ca=FILE replaces
// ClientCA), and the deny list of every tls! listener (--tls-deny).
type TLSFiles struct {
	Cert, Key, ClientCA string
	Deny                string
}

// Config loads the TLS configuration when one of addrs is a tls!
// listener (nil otherwise), and the server certificate it presents.
func (f TLSFiles) Config(addrs []string) (*tls.Config, *x509.Certificate, error) {
	var tlsAddr string
	for _, a := range addrs {
		if la, err := ParseListenAddr(a); err == nil && la.TLS {
			tlsAddr = a
			break
		}
	}
	if tlsAddr == "" {
		return nil, nil, nil
	}
	if f.Cert == "" || f.Key == "" || f.ClientCA == "" {
		return nil, nil, fmt.Errorf("--listen %s: a tls listener needs --tls-cert, --tls-key and --tls-client-ca (shardfs certs makes them)", tlsAddr)
	}
	conf, err := ServerTLSConfig(f.Cert, f.Key, f.ClientCA)
	if err != nil {
		return nil, nil, fmt.Errorf("--listen %s: %w", tlsAddr, err)
	}
	return conf, conf.Certificates[0].Leaf, nil
}

// Listeners are open listeners, as Open made them; Leaf is the
// certificate the tls! ones present (nil without one), as last loaded.
type Listeners struct {
	List []net.Listener
	Leaf *x509.Certificate
	cert string
	// auths are the tls! listeners' policies, which Reload reads again.
	auths []*tlsAuth
	// reloadMu serialises Reload.
	reloadMu sync.Mutex
}

// Open opens every address (see ParseListenAddr); on failure it closes
// those already open. Every address is parsed before any is opened, so
// that a typo costs nothing. files serve the tls! listeners.
func Open(addrs []string, files TLSFiles) (*Listeners, error) {
	for _, a := range addrs {
		if _, err := ParseListenAddr(a); err != nil {
			return nil, fmt.Errorf("--listen: %w", err) // it quotes the address
		}
	}
	ls := &Listeners{cert: files.Cert}
	auths := make([]*tlsAuth, len(addrs))
	for i, a := range addrs {
		la, _ := ParseListenAddr(a)
		if !la.TLS {
			continue
		}
		auth := &tlsAuth{files: files, la: la}
		pol, leaf, err := auth.load()
		if err != nil {
			return nil, fmt.Errorf("--listen %s: %w", a, err)
		}
		auth.cur.Store(pol)
		auths[i], ls.Leaf = auth, leaf
		ls.auths = append(ls.auths, auth)
	}
	for i, a := range addrs {
		la, _ := ParseListenAddr(a)
		l, err := openListener(la, auths[i])
		if err != nil {
			ls.Close()
			if errors.Is(err, ErrInsecure) {
				return nil, err // it names the address and the TLS alternative
			}
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		ls.List = append(ls.List, l)
	}
	return ls, nil
}

// Reload reads again what the tls! listeners serve with: the server
// certificate and key, the client CAs, the rules files and the deny
// list. New handshakes use them; a connection already accepted is closed
// (and logged) when its certificate is now denied, no longer in the
// listener's rules, or read-only there while it was served read-write;
// the others keep their session. When any file fails to load, nothing changes and the error
// names the file (and the line, for rules and deny list). Without tls!
// listeners it does nothing.
func (ls *Listeners) Reload() error {
	ls.reloadMu.Lock()
	defer ls.reloadMu.Unlock()
	pols := make([]*tlsPolicy, len(ls.auths))
	var leaf *x509.Certificate
	for i, a := range ls.auths {
		pol, l, err := a.load()
		if err != nil {
			return fmt.Errorf("reload of tls!%s: %w; the listeners keep what they had", a.la.Address, err)
		}
		pols[i], leaf = pol, l
	}
	for i, a := range ls.auths {
		a.cur.Store(pols[i])
	}
	// A certificate denied (or dropped from the rules) must not keep the
	// session it holds: one request every few minutes defeats the idle
	// timeout.
	for _, a := range ls.auths {
		a.reloaded()
	}
	if leaf != nil {
		ls.Leaf = leaf
	}
	return nil
}

// ReloadOnHangup calls Reload on every SIGHUP until the returned
// function is called (and the goroutine it started has ended). A reload
// that fails is logged and changes nothing; accepted connections are
// dropped only as Reload says.
func (ls *Listeners) ReloadOnHangup(log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				if err := ls.Reload(); err != nil {
					log.Error("SIGHUP: TLS reload refused", "err", err)
					continue
				}
				log.Info("SIGHUP: the TLS listeners' certificate, CAs, rules and deny list read again")
				LogCert(log, ls.cert, ls.leaf(), time.Now())
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

func (ls *Listeners) leaf() *x509.Certificate {
	ls.reloadMu.Lock()
	defer ls.reloadMu.Unlock()
	return ls.Leaf
}

// HasTLS reports whether a listener is tls!: only then is there anything
// for Reload to read.
func (ls *Listeners) HasTLS() bool { return len(ls.auths) > 0 }

// Close closes every listener.
func (ls *Listeners) Close() {
	for _, l := range ls.List {
		l.Close()
	}
}

// Log says where the tree is served, and which certificate the tls!
// listeners present (see LogCert).
func (ls *Listeners) Log(log *slog.Logger) {
	for _, l := range ls.List {
		log.Info("serving the tree over 9P", "addr", AddrString(l), "access", Access(l))
	}
	LogCert(log, ls.cert, ls.Leaf, time.Now())
}

// Socket is the path of the first unix listener, or empty.
func (ls *Listeners) Socket() string {
	for _, l := range ls.List {
		if l.Addr().Network() == "unix" {
			return l.Addr().String()
		}
	}
	return ""
}

// IsReadOnly reports whether l is ReadOnly.
func IsReadOnly(l net.Listener) bool { return isReadOnly(l) }

// Access names a listener's mode in log lines.
func Access(l net.Listener) string {
	if isReadOnly(l) {
		return "read-only"
	}
	return "read-write"
}

// AddrString writes a listener's address in the tree's own syntax, the
// one a client's --addr takes.
func AddrString(l net.Listener) string {
	a := l.Addr()
	if a.Network() == "unix" {
		return "unix!" + a.String()
	}
	host, port, _ := net.SplitHostPort(a.String())
	proto := "tcp"
	if IsTLS(l) {
		proto = "tls"
	}
	return proto + "!" + host + "!" + port
}

// LogCert says which certificate c (from file) the tls! listeners
// present, and warns when it expires within 30 days or is not valid now.
func LogCert(log *slog.Logger, file string, c *x509.Certificate, now time.Time) {
	if c == nil {
		return
	}
	names := append(append([]string(nil), c.DNSNames...), ipStrings(c.IPAddresses)...)
	args := []any{"cert", file, "cn", c.Subject.CommonName, "names", strings.Join(names, ","), "not_after", c.NotAfter.UTC().Format(time.RFC3339)}
	switch {
	case now.Before(c.NotBefore) || now.After(c.NotAfter):
		log.Warn("the TLS listeners' certificate is not valid now: clients will refuse it (or this machine's clock is wrong)", append(args, "not_before", c.NotBefore.UTC().Format(time.RFC3339))...)
	case c.NotAfter.Sub(now) < 30*24*time.Hour:
		log.Warn("the TLS listeners' certificate expires within 30 days: shardfs certs server makes a new one", args...)
	default:
		log.Info("TLS listeners' certificate", args...)
	}
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}
