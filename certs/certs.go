// Package certs makes the X.509 certificates of a tls! listener: a private
// CA, server certificates for the names and addresses clients dial, and
// client certificates, all ECDSA P-256, written as PEM.
//
// Decision: shardfs carries this small helper (`shardfs certs`) instead of
// documenting openssl commands. A client-authenticating CA needs the right
// key usages on each kind (serverAuth on the server's, clientAuth on the
// clients', CA:TRUE and certSign on the CA), subject alternative names
// for every name and IP the clients dial (a CN alone is ignored by Go and
// by browsers), and keys that only their owner can read; the openssl
// commands for that differ between OpenSSL versions and are easy to get
// subtly wrong, and the tests need the same code anyway, including
// expired certificates and certificates from another CA. The CA key never
// leaves the machine that ran `shardfs certs ca`; nothing here is
// revocable, so client certificates are short-lived by default (90 days)
// and reissued.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Kind says what a certificate is for.
type Kind int

const (
	// Server certificates carry serverAuth and the names clients dial.
	Server Kind = iota
	// Client certificates carry clientAuth; their common name is who the
	// server logs.
	Client
)

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Issued is a certificate with its key.
type Issued struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Validity is the time a certificate is valid: from NotBefore to NotAfter.
// The zero NotBefore means an hour ago (clock skew between machines).
type Validity struct {
	NotBefore, NotAfter time.Time
}

func (v Validity) bounds(now time.Time, def time.Duration) (time.Time, time.Time) {
	nb, na := v.NotBefore, v.NotAfter
	if nb.IsZero() {
		nb = now.Add(-time.Hour)
	}
	if na.IsZero() {
		na = now.Add(def)
	}
	return nb, na
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// NewCA makes a self-signed CA named name (valid 10 years by default).
func NewCA(name string, v Validity) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	nb, na := v.bounds(time.Now(), 10*365*24*time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             nb,
		NotAfter:              na,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue makes a certificate of kind k for name (the common name) and, for
// a server, every name in names, each an IP address or a DNS name. A
// server certificate is valid for a year by default, a client one for 90
// days.
func (ca *CA) Issue(k Kind, name string, names []string, v Validity) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := ca.IssueFor(&key.PublicKey, k, name, names, v)
	if err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, Key: key}, nil
}

// IssueFor is Issue for a key made elsewhere, whose private half the CA
// never sees (an enrolling node's, from its certificate request).
func (ca *CA) IssueFor(pub crypto.PublicKey, k Kind, name string, names []string, v Validity) (*x509.Certificate, error) {
	if name == "" {
		return nil, errors.New("certs: a certificate needs a name")
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	def := 90 * 24 * time.Hour
	usage := x509.ExtKeyUsageClientAuth
	if k == Server {
		def = 365 * 24 * time.Hour
		usage = x509.ExtKeyUsageServerAuth
	}
	nb, na := v.bounds(time.Now(), def)
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if k == Server {
		if len(names) == 0 {
			names = []string{name}
		}
		for _, n := range names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// TLS returns the certificate as tls.Config takes it.
func (i *Issued) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{i.Cert.Raw}, PrivateKey: i.Key, Leaf: i.Cert}
}

// Pool is a pool holding the CA's certificate alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// CertPEM and KeyPEM encode a certificate and a key.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func KeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles writes base.crt (mode 0644) and base.key (mode 0600, never
// over an existing file: a key is not replaced by accident). Neither
// write follows a symlink: the key is created with O_EXCL (which fails on
// any existing name, a dangling symlink included), and the certificate
// is written to a new file in the same folder and renamed over base.crt,
// which replaces a symlink there instead of writing where it points.
func WriteFiles(base string, cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	kp, err := KeyPEM(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return err
	}
	kf, err := os.OpenFile(base+".key", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := kf.Write(kp); err != nil {
		kf.Close()
		return err
	}
	if err := kf.Close(); err != nil {
		return err
	}
	return writeReplace(base+".crt", CertPEM(cert), 0o644)
}

// writeReplace writes data to name through a new file in its folder and
// a rename.
func writeReplace(name string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}

// LoadCA reads a CA written by WriteFiles (base.crt and base.key).
func LoadCA(base string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(base+".crt", base+".key")
	if err != nil {
		return nil, fmt.Errorf("certs: CA %s: %w", base, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("certs: CA %s: the key is not ECDSA", base)
	}
	if !pair.Leaf.IsCA {
		return nil, fmt.Errorf("certs: %s.crt is not a CA certificate", base)
	}
	return &CA{Cert: pair.Leaf, Key: key}, nil
}
