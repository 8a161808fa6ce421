package fsrv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/certs"
)

// pki is a CA with the certificates the TLS tests use, and another CA.
type pki struct {
	ca, other                    *certs.CA
	server                       *certs.Issued // for 127.0.0.1 and localhost
	client, expired, notYet      *certs.Issued
	fromOther, serverAsClient    *certs.Issued
	serverExpired, serverOtherCA *certs.Issued
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	must := func(i *certs.Issued, err error) *certs.Issued {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	ca, err := certs.NewCA("shardfs test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("another CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	past := certs.Validity{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)}
	future := certs.Validity{NotBefore: now.Add(24 * time.Hour), NotAfter: now.Add(48 * time.Hour)}
	names := []string{"127.0.0.1", "localhost"}
	return &pki{
		ca: ca, other: other,
		server:         must(ca.Issue(certs.Server, "node0", names, certs.Validity{})),
		client:         must(ca.Issue(certs.Client, "alice", nil, certs.Validity{})),
		expired:        must(ca.Issue(certs.Client, "bob-expired", nil, past)),
		notYet:         must(ca.Issue(certs.Client, "carol-future", nil, future)),
		fromOther:      must(other.Issue(certs.Client, "mallory", nil, certs.Validity{})),
		serverAsClient: must(ca.Issue(certs.Server, "node1", names, certs.Validity{})),
		serverExpired:  must(ca.Issue(certs.Server, "node-old", names, past)),
		serverOtherCA:  must(other.Issue(certs.Server, "impostor", names, certs.Validity{})),
	}
}

func (p *pki) serverConf(server *certs.Issued) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{server.TLS()}, ClientCAs: p.ca.Pool()}
}

// clientConf sends client whatever CAs the server names, as
// ClientTLSConfig's configuration does.
func (p *pki) clientConf(client *certs.Issued) *tls.Config {
	conf := &tls.Config{RootCAs: p.ca.Pool()}
	if client != nil {
		c := client.TLS()
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	return conf
}

// tlsServer serves fx on a tls! listener whose log the test reads;
// released receives once per connection given back (after its refusal is
// logged).
type tlsServer struct {
	srv      *Server
	addr     string // tls!127.0.0.1!PORT
	hostPort string
	logs     *syncBuffer
	released chan struct{}
}

func serveTLS(t *testing.T, fx *fixture, conf *tls.Config, opts string) *tlsServer {
	t.Helper()
	// The default bound: a handshake under -race on a loaded machine
	// takes far longer than the 200 ms the stalled-handshake test wants.
	return serveTLSBound(t, fx, conf, opts, 0)
}

// serveTLSBound is serveTLS whose handshakes time out after handshake
// (zero: DefaultHandshakeTimeout).
func serveTLSBound(t *testing.T, fx *fixture, conf *tls.Config, opts string, handshake time.Duration) *tlsServer {
	t.Helper()
	ts := &tlsServer{logs: &syncBuffer{}, released: make(chan struct{}, 100)}
	ts.srv = &Server{Root: fx.root, Clock: fx.clock, Logger: slog.New(slog.NewTextHandler(ts.logs, nil)), HandshakeTimeout: handshake}
	ts.srv.testReleased = func() { ts.released <- struct{}{} }
	l, err := ListenTLS("tls!127.0.0.1!0"+opts, conf)
	if err != nil {
		t.Fatal(err)
	}
	if !IsTLS(l) {
		t.Errorf("IsTLS(ListenTLS(tls!...%s)) = false", opts)
	}
	ts.hostPort = serveOn(t, ts.srv, l)
	_, port, _ := net.SplitHostPort(ts.hostPort)
	ts.addr = "tls!127.0.0.1!" + port
	return ts
}

// dialTLS connects with conf and attaches over 9P2000.L.
func (ts *tlsServer) dial(t *testing.T, conf *tls.Config) (p9.File, error) {
	t.Helper()
	c, err := Dial(context.Background(), ts.addr, conf)
	if err != nil {
		return nil, err
	}
	cl, err := p9.NewClient(c)
	if err != nil {
		c.Close()
		return nil, ExplainTLS(err, "")
	}
	t.Cleanup(func() { cl.Close() })
	return cl.Attach("")
}

// refusals counts the log lines of refused TLS connections with reason.
func (ts *tlsServer) refusals(reason string) int {
	return strings.Count(ts.logs.String(), `msg="fsrv: TLS connection refused" reason="`+reason)
}

// TestTLSRefusals: a client without a certificate, with one from another
// CA, an expired or not yet valid one, one not made for client
// authentication, a plain 9P client and one that stalls the handshake are
// each refused with one log line that says which, while a client
// connected before keeps being served and a new good client is served
// after. A second refusal for the same reason within a minute is not
// logged; the next line counts it.
func TestTLSRefusals(t *testing.T) {
	p := newPKI(t)
	fx := newFixture()
	ts := serveTLS(t, fx, p.serverConf(p.server), "")

	good, err := ts.dial(t, p.clientConf(p.client))
	if err != nil {
		t.Fatalf("good client: %v", err)
	}
	if got := readDotL(t, good, "status"); got != "READY\n" {
		t.Fatalf("good client: status = %q", got)
	}
	if !strings.Contains(ts.logs.String(), `msg="fsrv: TLS client" remote=127.0.0.1:`) || !strings.Contains(ts.logs.String(), `client="CN=alice"`) {
		t.Errorf("log after a good client:\n%s\nwant a line naming CN=alice", ts.logs)
	}
	stillGood := func(after string) {
		t.Helper()
		if got := readDotL(t, good, "status"); got != "READY\n" {
			t.Errorf("after %s, the good client read status = %q; want READY", after, got)
		}
	}
	cases := []struct {
		name       string
		conf       *tls.Config
		reason     string // in the server's log
		detail     string
		clientSays string
	}{
		{"no certificate", p.clientConf(nil), "no client certificate", "", "requires a client certificate"},
		{"another CA", p.clientConf(p.fromOther), "client certificate signed by another CA", `CN=mallory issued by \"another CA\"`, "signed by a CA the server does not trust"},
		{"expired", p.clientConf(p.expired), "client certificate expired", "CN=bob-expired expired at", "expired or not yet valid"},
		{"not yet valid", p.clientConf(p.notYet), "client certificate not yet valid", "CN=carol-future is not valid before", "expired or not yet valid"},
		{"server certificate as a client's", p.clientConf(p.serverAsClient), "client certificate not for client authentication", "CN=node1 lacks the clientAuth", "refused our client certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.dial(t, tc.conf)
			if err == nil || !strings.Contains(err.Error(), tc.clientSays) {
				t.Errorf("client: %v; want an error saying %q", err, tc.clientSays)
			}
			<-ts.released
			if n := ts.refusals(tc.reason); n != 1 {
				t.Errorf("%d log lines with reason %q; want 1:\n%s", n, tc.reason, ts.logs)
			}
			if !strings.Contains(ts.logs.String(), tc.detail) {
				t.Errorf("log has no %q:\n%s", tc.detail, ts.logs)
			}
			stillGood(tc.name)
		})
	}

	t.Run("plain 9P", func(t *testing.T) {
		c := rawConn(t, ts.hostPort)
		c.Write(versionFrame(msgTversion, noTag, 8192, "9P2000.L"))
		if got := replyAndHangup(t, c); len(got) >= 5 && got[4] == msgTversion+1 {
			t.Errorf("plain 9P on the TLS port got an Rversion: %x", got)
		}
		<-ts.released
		if n := ts.refusals("plain 9P on the TLS port"); n != 1 {
			t.Errorf("%d log lines for plain 9P; want 1:\n%s", n, ts.logs)
		}
		stillGood("plain 9P")
	})

	t.Run("TLS 1.2", func(t *testing.T) {
		conf := p.clientConf(p.client)
		conf.MaxVersion = tls.VersionTLS12
		c, err := tls.Dial("tcp", ts.hostPort, conf)
		if err == nil {
			c.Close()
		}
		if err := ExplainTLS(err, ""); err == nil || !strings.Contains(err.Error(), "the server speaks TLS 1.3 only") {
			t.Errorf("a TLS 1.2 client: %v; want an error saying the server speaks TLS 1.3 only", err)
		}
		<-ts.released
		if n := ts.refusals("TLS version below 1.3"); n != 1 {
			t.Errorf("%d log lines for a TLS 1.2 client; want 1:\n%s", n, ts.logs)
		}
		stillGood("a TLS 1.2 client")
	})

	t.Run("stalled handshake", func(t *testing.T) {
		// A server of its own with a short bound: good clients of the
		// other one must not race it on a loaded machine.
		short := serveTLSBound(t, fx, p.serverConf(p.server), "", 200*time.Millisecond)
		c := rawConn(t, short.hostPort) // sends nothing
		if got := replyAndHangup(t, c); len(got) != 0 {
			t.Errorf("a client that sent nothing got %x", got)
		}
		<-short.released
		if n := short.refusals("TLS handshake timed out"); n != 1 {
			t.Errorf("%d log lines for a stalled handshake; want 1:\n%s", n, short.logs)
		}
		stillGood("a stalled handshake")
	})

	t.Run("rate limit", func(t *testing.T) {
		ts.dial(t, p.clientConf(nil))
		<-ts.released
		if n := ts.refusals("no client certificate"); n != 1 {
			t.Errorf("a second refusal within the minute: %d log lines; want still 1:\n%s", n, ts.logs)
		}
		fx.clock.Advance(time.Minute)
		ts.dial(t, p.clientConf(nil))
		<-ts.released
		if n := ts.refusals("no client certificate"); n != 2 || !strings.Contains(ts.logs.String(), "more_refused=1") {
			t.Errorf("a minute later: %d log lines; want 2, the second with more_refused=1:\n%s", n, ts.logs)
		}
	})

	if _, err := ts.dial(t, p.clientConf(p.client)); err != nil {
		t.Errorf("a new good client after the refusals: %v", err)
	}
	stillGood("everything")
}

// TestTLSServerCertificate: the client says what is wrong with the
// server's certificate: another name, another CA, expired.
func TestTLSServerCertificate(t *testing.T) {
	p := newPKI(t)
	fx := newFixture()
	for _, tc := range []struct {
		name   string
		server *certs.Issued
		sni    string
		says   string
	}{
		{"another name", p.server, "node9.example", `is for another name: it names localhost, 127.0.0.1, not "node9.example"`},
		{"another CA", p.serverOtherCA, "", `(CN=impostor, issued by "another CA") is signed by another CA`},
		{"expired", p.serverExpired, "", "(CN=node-old) expired at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := serveTLS(t, fx, p.serverConf(tc.server), "")
			conf := p.clientConf(p.client)
			conf.ServerName = tc.sni
			_, err := ts.dial(t, conf)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("client: %v; want an error containing %q", err, tc.says)
			}
			<-ts.released
			if n := ts.refusals("the client refused the server's certificate"); n != 1 {
				t.Errorf("server: %d log lines saying the client refused its certificate; want 1:\n%s", n, ts.logs)
			}
		})
	}
}

// TestTLSReadOnly: a ,ro TLS listener serves reads and refuses writes
// with EACCES. The refusals are logged once a minute at most, the first
// with the client and the file; a read-write client of the same server,
// writing while they happen, is unaffected.
func TestTLSReadOnly(t *testing.T) {
	p := newPKI(t)
	fx := newFixture()
	ts := serveTLS(t, fx, p.serverConf(p.server), ",ro")
	root, err := ts.dial(t, p.clientConf(p.client))
	if err != nil {
		t.Fatal(err)
	}
	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Errorf("status = %q; want READY", got)
	}

	// A read-write TLS listener on the same server, its client holding
	// ctl open for writing.
	rwl, err := ListenTLS("tls!127.0.0.1!0", p.serverConf(p.server))
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(serveOn(t, ts.srv, rwl))
	rw := &tlsServer{addr: "tls!127.0.0.1!" + port}
	rwRoot, err := rw.dial(t, p.clientConf(p.client))
	if err != nil {
		t.Fatal(err)
	}
	_, rwCtl, err := rwRoot.Walk([]string{"ctl"})
	if err != nil {
		t.Fatal(err)
	}
	defer rwCtl.Close()
	if _, _, err := rwCtl.Open(p9.WriteOnly); err != nil {
		t.Fatal(err)
	}

	refuse := func() error {
		_, ctl, err := root.Walk([]string{"ctl"})
		if err != nil {
			return err
		}
		defer ctl.Close()
		if _, _, err := ctl.Open(p9.WriteOnly); !errors.Is(err, linux.EACCES) {
			return fmt.Errorf("open ctl for writing through a ,ro TLS listener = %v; want EACCES", err)
		}
		return nil
	}
	// Two refusals while the read-write client writes.
	done := make(chan error, 1)
	go func() {
		err := refuse()
		if err == nil {
			err = refuse()
		}
		done <- err
	}()
	for i := range 20 {
		if _, err := rwCtl.WriteAt([]byte(fmt.Sprintf("lease %d\n", i)), 0); err != nil {
			t.Fatalf("the read-write client's write %d: %v", i, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := rwCtl.WriteAt([]byte("stop\n"), 0); err != nil {
		t.Fatalf("the read-write client after the refusals: %v", err)
	}
	if h := fx.takeHandled(); len(h) != 21 || h[20] != "stop" {
		t.Errorf("commands handled: %q; want the read-write client's 21, none from the read-only one", h)
	}

	const line = `msg="fsrv: write refused on a read-only listener" remote=127.0.0.1:`
	if n := strings.Count(ts.logs.String(), line); n != 1 || !strings.Contains(ts.logs.String(), `client="CN=alice" file=ctl`) {
		t.Errorf("%d log lines of refused writes; want 1 naming the client and the file:\n%s", n, ts.logs)
	}
	fx.clock.Advance(time.Minute)
	if err := refuse(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(ts.logs.String(), line); n != 2 || !strings.Contains(ts.logs.String(), "more_refused=1") {
		t.Errorf("a minute later: %d log lines; want 2, the second with more_refused=1:\n%s", n, ts.logs)
	}
}

// TestListenTLSNeedsConfig: a tls! listener without a certificate or
// without client CAs is refused with ErrNoTLSConfig.
func TestListenTLSNeedsConfig(t *testing.T) {
	p := newPKI(t)
	noCA := p.serverConf(p.server)
	noCA.ClientCAs = nil
	for _, conf := range []*tls.Config{nil, {ClientCAs: p.ca.Pool()}, noCA} {
		l, err := ListenTLS("tls!127.0.0.1!0", conf)
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, ErrNoTLSConfig) {
			t.Errorf("ListenTLS(tls!..., %v) = %v; want ErrNoTLSConfig", conf != nil, err)
		}
	}
	if _, err := Listen("tls!127.0.0.1!0"); !errors.Is(err, ErrNoTLSConfig) {
		t.Errorf("Listen(tls!...) = %v; want ErrNoTLSConfig", err)
	}
	la, err := ParseListenAddr("tls!0.0.0.0!5641,ro")
	if want := (ListenAddr{Network: "tcp", Address: "0.0.0.0:5641", ReadOnly: true, TLS: true}); err != nil || la != want {
		t.Errorf("ParseListenAddr(tls!0.0.0.0!5641,ro) = %+v, %v; want %+v", la, err, want)
	}
}
