package baremetal

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/enroll"
)

// EnrollCAPath is where the image holds the enrollment CA's certificate,
// the only one the node trusts for the enrollment server.
const EnrollCAPath = "/etc/shardfs/enroll-ca.crt"

// Enrollment is what a node shows of its enrollment in its /enroll.
type Enrollment struct {
	Server      string // host:port
	Fingerprint string
	How         string // "approved" or "code"
	Requested   time.Time
	At          time.Time
}

// Text is the content of the node's /enroll/status.
func (e Enrollment) Text() []byte {
	return fmt.Appendf(nil, "server %s\nfingerprint %s\nrequested %s\nenrolled %s\nby %s\n",
		e.Server, e.Fingerprint, e.Requested.UTC().Format(time.RFC3339), e.At.UTC().Format(time.RFC3339), e.How)
}

// enrollNode asks the enrollment server for the node's secrets, with a
// key made now, until it has them or ctx ends, and writes them under
// root where runNode reads them: the token, the listener's certificate,
// key and client CA, etcd's files. Lines typed on the console (codes) are
// read from codes; a code cuts a waiting request short and is sent with
// the next one.
func enrollNode(ctx context.Context, clk clock.Clock, con *console, root string, s Settings, name string, mac net.HardwareAddr, addrs []string, codes <-chan string) (Enrollment, error) {
	e := Enrollment{Server: s.Enroll}
	pem, err := os.ReadFile(root + EnrollCAPath)
	if err != nil {
		return e, fmt.Errorf("enrollment: the image has no enrollment CA (%w): shardfs netboot --enroll-ca", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return e, fmt.Errorf("enrollment: %s holds no PEM certificate", EnrollCAPath)
	}
	cl := &enroll.Client{Addr: s.Enroll, CA: pool, Name: name, Addrs: addrs}
	if len(mac) > 0 {
		cl.MAC = mac.String()
	}
	newKey := func() error {
		if cl.Key, err = enroll.NewKey(); err != nil {
			return err
		}
		e.Fingerprint, e.Requested = cl.Fingerprint(), clk.Now()
		con.printf("enrollment: this node's key is %s", e.Fingerprint)
		con.printf("enrollment: approve it on the enrollment server (echo approve %s > /enroll/ctl), or type this node's one-time code here and press Enter", e.Fingerprint)
		return nil
	}
	if err := newKey(); err != nil {
		return e, err
	}
	code := ""
	var sec *enroll.Secrets
	err = retry(ctx, clk, con, "enrollment", func() error {
		for {
			actx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				var err error
				sec, err = cl.Enroll(actx, code, func() {
					con.printf("enrollment: %s (%s) at %s: waits for approval", name, e.Fingerprint, s.Enroll)
				})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
				cancel()
			case c := <-codes:
				cancel()
				if err = <-done; err == nil {
					// Approved while the code was typed.
					e.How = "approved"
					return nil
				}
				if strings.TrimSpace(c) == "" {
					continue
				}
				code = strings.TrimSpace(c)
				con.printf("enrollment: sending the code typed on the console")
				continue
			}
			if err == nil {
				e.How = "approved"
				if code != "" {
					e.How = "code"
				}
				return nil
			}
			if code != "" {
				code = ""
				con.printf("enrollment: the code was refused; waiting for approval instead")
			}
			if errors.Is(err, enroll.ErrRefused) && strings.Contains(err.Error(), "already enrolled") {
				// The reply was lost: this key was served once and never
				// will be again.
				if kerr := newKey(); kerr != nil {
					return kerr
				}
			}
			return err
		}
	})
	if err != nil {
		return e, err
	}
	e.At = clk.Now()
	if err := writeSecrets(root, cl, sec); err != nil {
		return e, err
	}
	con.printf("enrollment: the token, the listener's certificate%s received after %v: enrolled (%s)", etcdNote(sec), e.At.Sub(e.Requested).Round(time.Millisecond), e.How)
	return e, nil
}

func etcdNote(sec *enroll.Secrets) string {
	if len(sec.EtcdKey) > 0 || len(sec.EtcdCA) > 0 {
		return " and etcd's credentials"
	}
	return ""
}

// writeSecrets puts sec and the node's key where runNode reads them:
// /secrets (mode 0700, in memory: the root is the initramfs), the key
// and the token mode 0600.
func writeSecrets(root string, cl *enroll.Client, sec *enroll.Secrets) error {
	key, err := certs.KeyPEM(cl.Key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(root+filepath.Dir(TokenPath), 0o700); err != nil {
		return err
	}
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{TLSCertPath, sec.ListenerCert, 0o644},
		{TLSKeyPath, key, 0o600},
		{TLSClientCAPath, sec.ClientCA, 0o644},
		{TokenPath, []byte(sec.Token), 0o600},
		{EtcdCAPath, sec.EtcdCA, 0o644},
		{EtcdCertPath, sec.EtcdCert, 0o644},
		{EtcdKeyPath, sec.EtcdKey, 0o600},
	}
	for _, f := range files {
		if len(f.data) == 0 {
			continue
		}
		if err := writeFile(root+f.path, f.data, f.mode); err != nil {
			return fmt.Errorf("enrollment: %w", err)
		}
	}
	return nil
}

// consoleLines sends each line read from r on the returned channel, until
// r ends or ctx does.
func consoleLines(ctx context.Context, r io.Reader) <-chan string {
	ch := make(chan string)
	if r == nil {
		return ch
	}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			select {
			case ch <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// hideTyping turns the console's echo off: a one-time code typed there
// shows neither on the screen nor in a serial console's log.
func hideTyping(f *os.File) {
	t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		return
	}
	t.Lflag &^= unix.ECHO
	unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t)
}
