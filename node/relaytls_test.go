package node

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/fsrv"
)

// A tls! relay listener is a TLS server a bot library reaches as it would
// Discord: no client certificate, the server's own certificate from
// --tls-cert/--tls-key. One without them is refused.
func TestRelayTLSListener(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("relay test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(certs.Server, "relay", []string{"127.0.0.1"}, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(filepath.Join(dir, "server"), srv.Cert, srv.Key); err != nil {
		t.Fatal(err)
	}
	files := fsrv.TLSFiles{Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key")}
	if _, err := openRelay([]string{"tls!127.0.0.1!0"}, fsrv.TLSFiles{}); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("a tls! relay listener without a certificate: %v; want refused, naming --tls-cert", err)
	}
	ls, err := openRelay([]string{"tls!127.0.0.1!0"}, files)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "relay") })}
	served := make(chan struct{})
	go func() { hs.Serve(ls[0]); close(served) }()
	defer func() { hs.Close(); <-served }()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	resp, err := c.Get("https://" + ls[0].Addr().String() + "/api/v10/gateway/bot")
	if err != nil {
		t.Fatalf("an https GET with no client certificate: %v", err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "relay" || resp.TLS == nil {
		t.Errorf("GET over the relay's tls! listener = %q (TLS %v); want the relay's answer over TLS", b, resp.TLS != nil)
	}
}
