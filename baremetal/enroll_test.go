package baremetal

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/enroll"
)

// enrollBed is an enrollment server on loopback and a node root that
// trusts it.
func enrollBed(t *testing.T, codes []enroll.Code) (srv *enroll.Server, addr, root string) {
	t.Helper()
	ca, err := certs.NewCA("enrollment CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ca.Issue(certs.Server, "enroll", []string{"127.0.0.1"}, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	nodeCA, err := certs.NewCA("node CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err = enroll.New(enroll.Config{Cert: sc.TLS(), NodeCA: nodeCA, Codes: codes,
		Secrets: enroll.Secrets{Token: "tok-enrolled", ClientCA: certs.CertPEM(nodeCA.Cert), EtcdCA: certs.CertPEM(nodeCA.Cert)},
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ctx, l) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	root = t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc/shardfs"), 0o755)
	if err := os.WriteFile(root+EnrollCAPath, certs.CertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv, l.Addr().String(), root
}

// consoleUntil collects console lines until one holds marker, and
// returns them.
func consoleUntil(t *testing.T, out lines, marker string) []string {
	t.Helper()
	var seen []string
	for {
		l := next(t, out)
		seen = append(seen, l)
		if strings.Contains(l, marker) {
			return seen
		}
	}
}

// TestEnrollNodeApproved: the node prints its fingerprint, waits, and
// once approved leaves its secrets where runNode reads them; the key
// stays on the node, mode 0600.
func TestEnrollNodeApproved(t *testing.T) {
	srv, addr, root := enrollBed(t, nil)
	out := make(lines, 64)
	type result struct {
		e   Enrollment
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := enrollNode(context.Background(), clock.NewFake(), &console{w: out}, root, Settings{Enroll: addr}, "node-a", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, []string{"10.0.0.5"}, nil)
		done <- result{e, err}
	}()
	seen := consoleUntil(t, out, "waits for approval")
	var fp string
	for _, l := range seen {
		if _, after, ok := strings.Cut(l, "this node's key is "); ok {
			fp = strings.TrimSpace(after)
		}
	}
	if !enroll.ValidFingerprint(fp) {
		t.Fatalf("console %q; want the key's fingerprint", seen)
	}
	if err := srv.Approve(fp); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute): // a bound on a hang
		t.Fatal("enrollNode did not return within a minute")
	}
	if r.err != nil || r.e.Fingerprint != fp || r.e.How != "approved" {
		t.Fatalf("enrollNode = %+v, %v; want approved, %s", r.e, r.err, fp)
	}
	for path, mode := range map[string]os.FileMode{TokenPath: 0o600, TLSKeyPath: 0o600, TLSCertPath: 0o644, TLSClientCAPath: 0o644, EtcdCAPath: 0o644} {
		fi, err := os.Stat(root + path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %04o", path, fi, err, mode)
		}
	}
	if _, err := os.Stat(root + EtcdKeyPath); err == nil {
		t.Errorf("%s written though the server sent no etcd key", EtcdKeyPath)
	}
	// What runNode makes of them: the token, the default TLS listener.
	con := &console{w: io.Discard}
	if tok := readToken(con, root); tok != "tok-enrolled" {
		t.Errorf("readToken = %q; want the enrolled token", tok)
	}
	var s Settings
	if !checkListen(con, root, &s) || strings.Join(s.Listen, " ") != DefaultListen {
		t.Errorf("checkListen = %+v; want the enrolled TLS files and %s", s, DefaultListen)
	}
	if _, err := os.ReadFile(root + TLSKeyPath); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(r.e.Text()), "fingerprint "+fp+"\n") {
		t.Errorf("Enrollment.Text() = %q", r.e.Text())
	}
}

// TestEnrollNodeCode: a code typed on the console cuts the wait short;
// a wrong code is refused and the node waits for approval instead.
func TestEnrollNodeCode(t *testing.T) {
	const code = "GOOD-CODE-1234-5678"
	srv, addr, root := enrollBed(t, []enroll.Code{{For: "52:54:00:00:00:02", Code: code, Expires: time.Now().Add(time.Hour)}})
	_ = srv
	out := make(lines, 64)
	typed := make(chan string)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clock.NewFake()
	done := make(chan error, 1)
	var e Enrollment
	go func() {
		var err error
		e, err = enrollNode(ctx, clk, &console{w: out}, root, Settings{Enroll: addr}, "node-b", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}, nil, typed)
		done <- err
	}()
	consoleUntil(t, out, "waits for approval")
	typed <- "WRONG-CODE-0000-0000"
	consoleUntil(t, out, "the code was refused")
	// The refusal is retried after the backoff: the fake clock moves it.
	l := consoleUntil(t, out, "retrying in")
	clk.Advance(RetryMin)
	consoleUntil(t, out, "waits for approval")
	typed <- code
	select {
	case err := <-done:
		if err != nil || e.How != "code" {
			t.Fatalf("enrollNode = %+v, %v; want enrolled by code", e, err)
		}
	case <-time.After(time.Minute): // a bound on a hang
		t.Fatalf("enrollNode did not return within a minute; console %q", l)
	}
	if b, err := os.ReadFile(root + TokenPath); err != nil || string(b) != "tok-enrolled" {
		t.Errorf("token = %q, %v", b, err)
	}
}
