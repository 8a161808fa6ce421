package enroll

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Request is what a node sends, as one JSON line, once the TLS handshake
// is done.
type Request struct {
	// Name is the node's name (shardfs.node, the DHCP host name or
	// pxe-MAC).
	Name string `json:"name"`
	// MAC is the hardware address of the NIC the node booted from.
	MAC string `json:"mac"`
	// Addrs are the node's IP addresses, which the listener's
	// certificate names.
	Addrs []string `json:"addrs,omitempty"`
	// CSR is a certificate signing request (DER) for the key the TLS
	// handshake presented.
	CSR []byte `json:"csr"`
	// Code, when set, is a one-time enrollment code.
	Code string `json:"code,omitempty"`
}

// The statuses of a Reply.
const (
	StatusPending  = "pending"
	StatusApproved = "approved"
	StatusRefused  = "refused"
)

// Reply is one JSON line from the server: "pending" first while the
// request waits, then "approved" with the secrets, or "refused" with the
// reason.
type Reply struct {
	Status string `json:"status"`
	// Error says why a request was refused.
	Error string `json:"error,omitempty"`
	// Fingerprint is the node's, as the server saw it.
	Fingerprint string   `json:"fingerprint,omitempty"`
	Secrets     *Secrets `json:"secrets,omitempty"`
}

// Secrets are what an approved node receives.
type Secrets struct {
	// Token is the bot's token.
	Token string `json:"token,omitempty"`
	// ListenerCert is the PEM certificate of the node's TLS listener,
	// for the key the node enrolled with, signed by the node CA.
	ListenerCert []byte `json:"listener_cert,omitempty"`
	// ClientCA is the PEM CA of the clients the listener accepts.
	ClientCA []byte `json:"client_ca,omitempty"`
	// EtcdCA, EtcdCert and EtcdKey are etcd's TLS files (PEM), when the
	// server has them.
	EtcdCA   []byte `json:"etcd_ca,omitempty"`
	EtcdCert []byte `json:"etcd_cert,omitempty"`
	EtcdKey  []byte `json:"etcd_key,omitempty"`
}

// MaxRequest is the largest request line a server reads.
const MaxRequest = 64 << 10

// Errors of a refused request, as Client.Enroll returns them.
var (
	ErrRefused    = errors.New("enrollment refused")
	ErrBadRequest = errors.New("malformed enrollment request")
)

// NewKey makes a node's key pair.
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// Fingerprint names a public key: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo.
func Fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// ValidFingerprint reports whether s has a fingerprint's form.
func ValidFingerprint(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(h) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// selfSigned is the certificate a node presents in the TLS handshake:
// it proves the key, nothing else.
func selfSigned(key *ecdsa.PrivateKey, name string) (tls.Certificate, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// csr is a node's certificate signing request for its listener.
func csr(key *ecdsa.PrivateKey, name string) ([]byte, error) {
	return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
}

// checkCSR parses der and checks that it is signed by, and for, the key
// the handshake presented.
func checkCSR(der []byte, peer crypto.PublicKey) (*x509.CertificateRequest, error) {
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: CSR: %v", ErrBadRequest, err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: CSR signature: %v", ErrBadRequest, err)
	}
	k, ok := req.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !k.Equal(peer) {
		return nil, fmt.Errorf("%w: the CSR is not for the key of the TLS handshake", ErrBadRequest)
	}
	return req, nil
}
