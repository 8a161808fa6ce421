package certs

import (
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// A server certificate verifies for the names and addresses it was made
// for and for server authentication only; a client certificate for client
// authentication only; neither verifies against another CA.
func TestIssueVerify(t *testing.T) {
	ca, err := NewCA("test CA", Validity{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other CA", Validity{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(Server, "node0", []string{"node0.example", "10.0.0.5"}, Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(srv.Cert.DNSNames, []string{"node0.example"}) || len(srv.Cert.IPAddresses) != 1 || !srv.Cert.IPAddresses[0].Equal(net.ParseIP("10.0.0.5")) {
		t.Errorf("server certificate names %v %v; want node0.example and 10.0.0.5", srv.Cert.DNSNames, srv.Cert.IPAddresses)
	}
	cli, err := ca.Issue(Client, "alice", nil, Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(cli.Cert.NotAfter); d < 89*24*time.Hour || d > 91*24*time.Hour {
		t.Errorf("client certificate valid for %v; want 90 days", d)
	}
	verify := func(c *Issued, pool *CA, name string, usage x509.ExtKeyUsage) error {
		_, err := c.Cert.Verify(x509.VerifyOptions{Roots: pool.Pool(), DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	for _, tc := range []struct {
		what  string
		c     *Issued
		ca    *CA
		name  string
		usage x509.ExtKeyUsage
		ok    bool
	}{
		{"server by DNS name", srv, ca, "node0.example", x509.ExtKeyUsageServerAuth, true},
		{"server by IP", srv, ca, "10.0.0.5", x509.ExtKeyUsageServerAuth, true},
		{"server for another name", srv, ca, "node1.example", x509.ExtKeyUsageServerAuth, false},
		{"server as a client", srv, ca, "", x509.ExtKeyUsageClientAuth, false},
		{"client", cli, ca, "", x509.ExtKeyUsageClientAuth, true},
		{"client as a server", cli, ca, "", x509.ExtKeyUsageServerAuth, false},
		{"client against another CA", cli, other, "", x509.ExtKeyUsageClientAuth, false},
	} {
		if err := verify(tc.c, tc.ca, tc.name, tc.usage); (err == nil) != tc.ok {
			t.Errorf("%s: Verify = %v; want ok %t", tc.what, err, tc.ok)
		}
	}
	if _, err := ca.Issue(Client, "", nil, Validity{}); err == nil {
		t.Error("Issue without a name = nil; want an error")
	}
}

// WriteFiles writes the key 0600 and never over an existing one; LoadCA
// reads a CA back and refuses a certificate that is not a CA.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("test CA", Validity{})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "sub", "ca")
	if err := WriteFiles(base, ca.Cert, ca.Key); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(base + ".key"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v, %v; want mode 0600", fi, err)
	}
	if err := WriteFiles(base, ca.Cert, ca.Key); !errors.Is(err, fs.ErrExist) {
		t.Errorf("WriteFiles over an existing key = %v; want fs.ErrExist", err)
	}
	back, err := LoadCA(base)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Cert.Equal(ca.Cert) || !back.Key.Equal(ca.Key) {
		t.Error("LoadCA returned another CA than the one written")
	}
	leaf, err := ca.Issue(Client, "alice", nil, Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(filepath.Join(dir, "alice"), leaf.Cert, leaf.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(filepath.Join(dir, "alice")); err == nil {
		t.Error("LoadCA of a client certificate = nil; want an error")
	}
}

// WriteFiles never writes through a symlink planted at base.key or
// base.crt: the key is refused, the certificate replaces the link, and
// the files they pointed at are untouched.
func TestFilesNoSymlink(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("test CA", Validity{})
	if err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "a")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), base+".key"); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(base, ca.Cert, ca.Key); !errors.Is(err, fs.ErrExist) {
		t.Errorf("WriteFiles with a dangling symlink at a.key = %v; want fs.ErrExist", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the symlink's target was created: %v", err)
	}
	base = filepath.Join(dir, "b")
	if err := os.Symlink(victim, base+".crt"); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(base, ca.Cert, ca.Key); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the file b.crt linked to = %q; want it untouched", b)
	}
	if fi, err := os.Lstat(base + ".crt"); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("b.crt = %v, %v; want a regular file of mode 0644", fi, err)
	}
	if _, err := LoadCA(base); err != nil {
		t.Errorf("LoadCA(b) = %v", err)
	}
}
