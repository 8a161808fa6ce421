package fsrv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/certs"
)

// authFiles writes the server certificate, its key and the CA of p to
// dir, and returns the files.
func authFiles(t *testing.T, p *pki, dir string) TLSFiles {
	t.Helper()
	if err := certs.WriteFiles(filepath.Join(dir, "server"), p.server.Cert, p.server.Key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), certs.CertPEM(p.ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	return TLSFiles{Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key"), ClientCA: filepath.Join(dir, "ca.crt")}
}

func writeText(t *testing.T, file, text string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// dialAttach connects to a tls! address and attaches over 9P2000.L.
func dialAttach(t *testing.T, addr string, conf *tls.Config) (p9.File, error) {
	t.Helper()
	c, err := Dial(context.Background(), addr, conf)
	if err != nil {
		return nil, err
	}
	cl, err := p9.NewClient(c, p9.WithMessageSize(8192))
	if err != nil {
		c.Close()
		return nil, ExplainTLS(err, "")
	}
	t.Cleanup(func() { cl.Close() })
	return cl.Attach("")
}

func writeCtl(root p9.File, line string) error {
	_, f, err := root.Walk([]string{"ctl"})
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(line), 0)
	return err
}

// TestRoles: a read-only certificate (by the listener's rules) on a
// read-write listener gets EACCES; a read-write one writes, and its
// write is audited with its CN and serial; a certificate the rules do
// not name is refused in the handshake.
func TestRoles(t *testing.T) {
	fx := newFixture()
	p := newPKI(t)
	dir := t.TempDir()
	files := authFiles(t, p, dir)
	grafana, err := p.ca.Issue(certs.Client, "grafana", nil, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := p.ca.Issue(certs.Client, "stranger", nil, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "clients")
	writeText(t, rules, fmt.Sprintf("# who may use this listener\nalice rw\n%s ro\n", FingerprintOf(grafana.Cert)))
	ls, err := Open([]string{"tls!127.0.0.1!0,clients=" + rules}, files)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var audited []AuditRecord
	srv := &Server{Root: fx.root, Clock: fx.clock, Logger: testLogger(t), Audit: func(r AuditRecord) {
		mu.Lock()
		audited = append(audited, r)
		mu.Unlock()
	}}
	serveOn(t, srv, ls.List[0])
	addr := AddrString(ls.List[0])

	ro, err := dialAttach(t, addr, p.clientConf(grafana))
	if err != nil {
		t.Fatalf("the read-only certificate: %v", err)
	}
	if err := writeCtl(ro, "stop\n"); !errors.Is(err, linux.EACCES) {
		t.Errorf("ctl write with a read-only certificate on a read-write listener = %v; want EACCES", err)
	}
	rw, err := dialAttach(t, addr, p.clientConf(p.client))
	if err != nil {
		t.Fatalf("the read-write certificate: %v", err)
	}
	if err := writeCtl(rw, "stop\n"); err != nil {
		t.Errorf("ctl write with a read-write certificate = %v", err)
	}
	if h := fx.takeHandled(); len(h) != 1 || h[0] != "stop" {
		t.Errorf("commands handled: %q; want the read-write client's stop only", h)
	}
	mu.Lock()
	want := AuditRecord{Listener: addr, Who: "cn=alice serial=" + Serial(p.client.Cert), File: "ctl", Bytes: 4, Command: "stop"}
	if len(audited) != 1 || !strings.HasPrefix(audited[0].Peer, "127.0.0.1:") {
		t.Errorf("audited %+v; want one record from 127.0.0.1", audited)
	} else if audited[0].Peer = ""; audited[0] != want {
		t.Errorf("audit record %+v; want %+v", audited[0], want)
	}
	mu.Unlock()
	if _, err := dialAttach(t, addr, p.clientConf(stranger)); err == nil || !strings.Contains(err.Error(), "refused our client certificate") {
		t.Errorf("a certificate the rules do not name: %v; want refused", err)
	}
}

// TestReloadDeny: a serial put on the deny list is refused after Reload,
// and the connection it already had is closed (it stayed served, and a
// request now and then kept it from idling out: attack21b F7), while
// another certificate's connection stays served; a bad rules line or
// deny list is refused at start and at reload, naming the line, and a
// bad reload keeps what the listener had.
func TestReloadDeny(t *testing.T) {
	fx := newFixture()
	p := newPKI(t)
	dir := t.TempDir()
	files := authFiles(t, p, dir)
	files.Deny = filepath.Join(dir, "deny")
	writeText(t, files.Deny, "# nobody yet\n")
	rules := filepath.Join(dir, "clients")
	writeText(t, rules, "alice rw\ndave rw\n")
	dave, err := p.ca.Issue(certs.Client, "dave", nil, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := Open([]string{"tls!127.0.0.1!0,clients=" + rules}, files)
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	srv := &Server{Root: fx.root, Clock: fx.clock, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	serveOn(t, srv, ls.List[0])
	addr := AddrString(ls.List[0])
	held, err := dialAttach(t, addr, p.clientConf(p.client))
	if err != nil {
		t.Fatal(err)
	}
	other, err := dialAttach(t, addr, p.clientConf(dave))
	if err != nil {
		t.Fatal(err)
	}

	writeText(t, files.Deny, "serial="+Serial(p.client.Cert)+"\n")
	if err := ls.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := dialAttach(t, addr, p.clientConf(p.client)); err == nil || !strings.Contains(err.Error(), "refused our client certificate") {
		t.Errorf("a denied serial after the reload: %v; want refused", err)
	}
	if err := writeCtl(held, "start\n"); err == nil {
		t.Errorf("the denied certificate's connection accepted before the reload wrote ctl; want it closed")
	}
	if want := "no longer allowed after the reload"; !strings.Contains(logged.String(), want) || !strings.Contains(logged.String(), "serial="+Serial(p.client.Cert)) {
		t.Errorf("log %q; want a line %q naming the serial", logged.String(), want)
	}
	if err := writeCtl(other, "start\n"); err != nil {
		t.Errorf("another certificate's connection accepted before the reload: %v; want it served", err)
	}

	// A bad line: refused at reload, naming it; the old rules stay.
	writeText(t, files.Deny, "")
	writeText(t, rules, "alice rw\nbob admin\n")
	if err := ls.Reload(); err == nil || !strings.Contains(err.Error(), rules+":2:") || !strings.Contains(err.Error(), `"bob admin"`) {
		t.Errorf("Reload with a bad rules line = %v; want an error naming %s:2", err, rules)
	}
	if _, err := dialAttach(t, addr, p.clientConf(p.client)); err == nil {
		t.Errorf("after a bad reload the client is served: the deny list of the good reload must stay")
	}
	// And at start.
	if _, err := Open([]string{"tls!127.0.0.1!0,clients=" + rules}, files); err == nil || !strings.Contains(err.Error(), rules+":2:") {
		t.Errorf("Open with a bad rules line = %v; want an error naming %s:2", err, rules)
	}
	writeText(t, rules, "alice rw\n")
	writeText(t, files.Deny, "not-a-serial\n")
	if _, err := Open([]string{"tls!127.0.0.1!0"}, files); err == nil || !strings.Contains(err.Error(), files.Deny+":1:") {
		t.Errorf("Open with a deny list that does not parse = %v; want an error naming %s:1", err, files.Deny)
	}
}

// TestPerListenerCA: a listener's ca= replaces --tls-client-ca for it: a
// certificate of the other CA is taken there and refused on the listener
// of the default CA.
func TestPerListenerCA(t *testing.T) {
	fx := newFixture()
	p := newPKI(t)
	dir := t.TempDir()
	files := authFiles(t, p, dir)
	otherCA := filepath.Join(dir, "other.crt")
	if err := os.WriteFile(otherCA, certs.CertPEM(p.other.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	ls, err := Open([]string{"tls!127.0.0.1!0", "tls!127.0.0.1!0,ca=" + otherCA}, files)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Root: fx.root, Clock: fx.clock, Logger: testLogger(t)}
	serveOn(t, srv, ls.List[0])
	serveOn(t, srv, ls.List[1])
	if _, err := dialAttach(t, AddrString(ls.List[1]), p.clientConf(p.fromOther)); err != nil {
		t.Errorf("a certificate of the listener's own CA: %v", err)
	}
	if _, err := dialAttach(t, AddrString(ls.List[0]), p.clientConf(p.fromOther)); err == nil {
		t.Errorf("a certificate of another CA on the default listener: served; want refused")
	}
	if _, err := dialAttach(t, AddrString(ls.List[1]), p.clientConf(p.client)); err == nil {
		t.Errorf("a certificate of the default CA on the ca= listener: served; want refused")
	}
}

// TestDenyListForms: the forms openssl prints parse; others do not.
func TestDenyListForms(t *testing.T) {
	p := newPKI(t)
	fp := FingerprintOf(p.client.Cert)
	colons := strings.ToUpper(fp.String())
	var b strings.Builder
	for i := 0; i < len(colons); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(colons[i : i+2])
	}
	for _, line := range []string{
		fp.String(), "sha256:" + fp.String(), "sha256 Fingerprint=" + b.String(),
		"serial=" + Serial(p.client.Cert), Serial(p.client.Cert), strings.ToLower(Serial(p.client.Cert)),
	} {
		d, err := ParseDenyList(strings.NewReader(line+"\n"), "deny")
		if err != nil || !d.Denies(p.client.Cert) || d.Denies(p.expired.Cert) {
			t.Errorf("ParseDenyList(%q) = %v; want it to deny the client's certificate only", line, err)
		}
	}
	for _, line := range []string{"zz", "serial=", strings.Repeat("ab", 21)} {
		if _, err := ParseDenyList(strings.NewReader(line+"\n"), "deny"); err == nil || !strings.Contains(err.Error(), "deny:1:") {
			t.Errorf("ParseDenyList(%q) = %v; want an error naming deny:1", line, err)
		}
	}
}

// TestAuditUnixPeer: a write through a unix socket is audited with the
// writer's uid and pid (SO_PEERCRED).
func TestAuditUnixPeer(t *testing.T) {
	fx := newFixture()
	var got []AuditRecord
	var mu sync.Mutex
	srv := &Server{Root: fx.root, Clock: fx.clock, Logger: testLogger(t), Audit: func(r AuditRecord) {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	}}
	l, err := Listen("unix!" + filepath.Join(t.TempDir(), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv, l)
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := p9.NewClient(c, p9.WithMessageSize(8192))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	root, err := cl.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeCtl(root, "lease 30s\n"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprintf("uid=%d pid=%d", os.Getuid(), os.Getpid())
	if len(got) != 1 || got[0].Who != want || got[0].Listener != "unix!"+addr || got[0].Command != "lease" {
		t.Errorf("audited %+v; want one record of %s through unix!%s, cmd lease", got, want, addr)
	}
}

// A serial of an odd number of hex digits (a leading zero nibble) is
// written in whole bytes and parsed back in either form.
func TestSerialOddDigits(t *testing.T) {
	n, _ := new(big.Int).SetString("EA1732C0A5B5F0DAA4927DE5C03AAB9", 16)
	if got := serialText(n); got != "0EA1732C0A5B5F0DAA4927DE5C03AAB9" {
		t.Errorf("serialText = %q; want whole bytes", got)
	}
	for _, line := range []string{"EA1732C0A5B5F0DAA4927DE5C03AAB9", "serial=0EA1732C0A5B5F0DAA4927DE5C03AAB9"} {
		d, err := ParseDenyList(strings.NewReader(line), "deny")
		if err != nil {
			t.Fatalf("ParseDenyList(%q) = %v", line, err)
		}
		if _, ok := d.serials["0EA1732C0A5B5F0DAA4927DE5C03AAB9"]; !ok {
			t.Errorf("ParseDenyList(%q) holds %v", line, d.serials)
		}
	}
}

func TestCommandWord(t *testing.T) {
	for line, want := range map[string]string{
		"stop":                           "stop",
		"lease 30s":                      "lease",
		"  reset all ":                   "reset",
		`{"op":3,"d":{"status":"idle"}}`: "op3",
		`{"d":{}}`:                       "",
		`{not json`:                      "",
		"reshard 16":                     "reshard",
		"x=1":                            "",
	} {
		if got := commandWord([]byte(line)); got != want {
			t.Errorf("commandWord(%q) = %q; want %q", line, got, want)
		}
	}
}

// TestReadOnlyWhy: attack report finding 11. A write refused on a
// connection made read-only by the listener's rules file names the
// certificate, not a ",ro" the listener does not have; a file that takes
// no writes is named read-only on any connection.
func TestReadOnlyWhy(t *testing.T) {
	srv := &Server{Root: newFixture().root, Logger: testLogger(t)}
	ctl, state := &Ctl{Name: "ctl", Path: "ctl", Handle: func(string) error { return nil }}, &Text{Name: "state"}
	for _, tc := range []struct {
		sess *session
		n    File
		want string
	}{
		{&session{Server: srv, ro: true, roCert: true}, ctl, "permission denied: ctl is read-only for this certificate (the listener's rules file names it ro)"},
		{&session{Server: srv, ro: true}, ctl, "permission denied: ctl is read-only on this listener"},
		{&session{Server: srv}, state, "permission denied: state is read-only"},
		{&session{Server: srv, ro: true, roCert: true}, state, "permission denied: state is read-only"},
	} {
		if got := tc.sess.refuseWrite(tc.n).Error(); got != tc.want {
			t.Errorf("refuseWrite(%s), ro %v, roCert %v = %q; want %q", FileName(tc.n), tc.sess.ro, tc.sess.roCert, got, tc.want)
		}
	}
}
