package enroll

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
)

// Client is a node asking for its secrets.
type Client struct {
	// Addr is the enrollment server's host:port.
	Addr string
	// CA is the enrollment CA, the only one the client trusts for the
	// server.
	CA *x509.CertPool
	// Key is the node's key, made at boot (NewKey); it never leaves.
	Key *ecdsa.PrivateKey
	// Name, MAC and Addrs are the node's name, NIC address and IP
	// addresses, as the request carries them: the server shows them to
	// the operator and names the node itself.
	Name, MAC string
	Addrs     []string
}

// Fingerprint is the fingerprint of the client's key.
func (c *Client) Fingerprint() string {
	fp, _ := Fingerprint(&c.Key.PublicKey)
	return fp
}

// Enroll sends one request, with code when it is set, and returns the
// secrets once the server approves it. pending, when set, is called when
// the server says the request waits for the operator. A refusal is
// ErrRefused with the server's reason.
func (c *Client) Enroll(ctx context.Context, code string, pending func()) (*Secrets, error) {
	self, err := selfSigned(c.Key, c.Name)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return nil, fmt.Errorf("enroll: server address %q: %w", c.Addr, err)
	}
	d := tls.Dialer{Config: &tls.Config{
		RootCAs: c.CA, ServerName: host, MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{self},
	}}
	conn, err := d.DialContext(ctx, "tcp", c.Addr)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	der, err := csr(c.Key, c.Name)
	if err != nil {
		return nil, err
	}
	// A name the server would refuse (a DHCP host name with '_', say) is
	// left out: the server names the node anyway, and shows the name only
	// to the operator.
	name := strings.ToLower(c.Name)
	if !ValidName(name) {
		name = ""
	}
	b, err := json.Marshal(Request{Name: name, MAC: c.MAC, Addrs: c.Addrs, CSR: der, Code: code})
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, c.ended(ctx, err)
	}
	dec := json.NewDecoder(bufio.NewReader(conn))
	for {
		var r Reply
		if err := dec.Decode(&r); err != nil {
			return nil, c.ended(ctx, err)
		}
		switch r.Status {
		case StatusPending:
			if pending != nil {
				pending()
			}
		case StatusApproved:
			if r.Secrets == nil {
				return nil, errors.New("enroll: approved without secrets")
			}
			if err := c.checkListenerCert(r.Secrets.ListenerCert); err != nil {
				return nil, err
			}
			return r.Secrets, nil
		case StatusRefused:
			return nil, fmt.Errorf("%w: %s", ErrRefused, r.Error)
		default:
			return nil, fmt.Errorf("enroll: unknown status %q", r.Status)
		}
	}
}

func (c *Client) ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("enroll: %w", err)
}

// checkListenerCert checks that the certificate the server signed is for
// the client's key.
func (c *Client) checkListenerCert(p []byte) error {
	blk, _ := pem.Decode(p)
	if blk == nil {
		return errors.New("enroll: the listener certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Errorf("enroll: the listener certificate: %w", err)
	}
	if !c.Key.PublicKey.Equal(cert.PublicKey) {
		return errors.New("enroll: the listener certificate is not for this node's key")
	}
	return nil
}
