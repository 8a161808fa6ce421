package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/enroll"
)

// TestNetbootServe: netboot --serve makes a code for a MAC line without
// one and prints it once; a node with that MAC enrolls with it and gets
// the token and a listener certificate from the node CA, for the name
// --node-names gives its MAC and the address it came from, not for what
// it asked; the code is spent; the code and the token are never logged;
// a node CA that is also the client CA is warned about; the process is
// not dumpable.
func TestNetbootServe(t *testing.T) {
	dir := t.TempDir()
	pki, enrollPKI := filepath.Join(dir, "pki"), filepath.Join(dir, "enroll-pki")
	for _, args := range [][]string{
		{"certs", "ca", "--dir", pki},
		{"certs", "ca", "--dir", enrollPKI},
		{"certs", "server", "--dir", enrollPKI, "--name", "enroll", "--host", "127.0.0.1"},
	} {
		if err := run(context.Background(), args, nil, io.Discard, io.Discard); err != nil {
			t.Fatalf("shardfs %q: %v", args, err)
		}
	}
	tokenFile, codeFile := filepath.Join(dir, "token"), filepath.Join(dir, "codes")
	os.WriteFile(tokenFile, []byte("SEKRIT-TOKEN\n"), 0o600)
	os.WriteFile(codeFile, []byte("# the rack's first node\n52:54:00:00:00:09\n"), 0o600)
	namesFile := filepath.Join(dir, "names")
	os.WriteFile(namesFile, []byte("52:54:00:00:00:09 rack1-a # the rack's first node\n"), 0o644)
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() {
		runErr = run(ctx, []string{"netboot", "--serve", addr, "--enroll-cert", filepath.Join(enrollPKI, "enroll.crt"),
			"--enroll-key", filepath.Join(enrollPKI, "enroll.key"), "--node-ca", filepath.Join(pki, "ca"),
			"--tls-client-ca", filepath.Join(pki, "ca.crt"), "--token-file", tokenFile, "--enroll-code", codeFile, "--node-names", namesFile,
			"--listen", "unix!" + filepath.Join(dir, "enroll.sock")}, nil, outW, errW)
		outW.Close()
		errW.Close()
	})
	defer func() { cancel(); wg.Wait() }()
	var code string
	stdout := bufio.NewScanner(outR)
	if !stdout.Scan() {
		t.Fatal("netboot --serve printed no code")
	}
	// The code goes to a 0600 file, never to stdout (the journal under
	// systemd): attack report 21b, finding 12.
	line := stdout.Text()
	if !strings.HasPrefix(line, "one-time codes for 1 nodes, good until ") || !strings.HasSuffix(line, "in "+codeFile+".issued (mode 0600)") {
		t.Fatalf("stdout = %q; want where the code is", line)
	}
	issued, err := os.ReadFile(codeFile + ".issued")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(issued), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "52:54:00:00:00:09" {
			code = f[1]
		}
	}
	fi, err := os.Stat(codeFile + ".issued")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || code == "" || strings.Contains(line, code) {
		t.Fatalf("%s.issued: mode %v, code %q; want mode 0600 with the code, and stdout (%q) without it", codeFile, fi.Mode(), code, line)
	}
	go io.Copy(io.Discard, outR)
	var log strings.Builder
	logDone := make(chan struct{})
	listening := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(errR)
		once := sync.OnceFunc(func() { close(listening) })
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "serving /enroll over 9P") {
				once()
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(time.Minute): // a bound on a hang
		t.Fatal("netboot --serve did not listen within a minute")
	}

	pool := x509.NewCertPool()
	b, _ := os.ReadFile(filepath.Join(enrollPKI, "ca.crt"))
	pool.AppendCertsFromPEM(b)
	node := func() *enroll.Client {
		k, err := enroll.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		return &enroll.Client{Addr: addr, CA: pool, Key: k, Name: "admin", MAC: "52:54:00:00:00:09", Addrs: []string{"10.0.0.21"}}
	}
	sec, err := node().Enroll(ctx, code, nil)
	if err != nil {
		t.Fatalf("Enroll with the printed code = %v", err)
	}
	if sec.Token != "SEKRIT-TOKEN" || len(sec.ListenerCert) == 0 {
		t.Errorf("secrets: token %q, listener certificate %d bytes; want the token and a certificate", sec.Token, len(sec.ListenerCert))
	}
	nodeCA, err := certs.LoadCA(filepath.Join(pki, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node.crt"), sec.ListenerCert, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rack1-a", "127.0.0.1"} {
		if err := verifyListenerCert(filepath.Join(dir, "node.crt"), nodeCA, name); err != nil {
			t.Errorf("the listener certificate for %s: %v", name, err)
		}
	}
	for _, name := range []string{"admin", "10.0.0.21"} {
		if err := verifyListenerCert(filepath.Join(dir, "node.crt"), nodeCA, name); err == nil {
			t.Errorf("the listener certificate is good for %s, which the node asked for; want it not", name)
		}
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("netboot --serve running: PR_GET_DUMPABLE = %d, %v; want 0", d, err)
	}
	if _, err := node().Enroll(ctx, code, nil); !errors.Is(err, enroll.ErrRefused) {
		t.Errorf("the code again = %v; want refused", err)
	}
	cancel()
	wg.Wait()
	errR.Close()
	<-logDone
	if runErr != nil {
		t.Errorf("netboot --serve = %v", runErr)
	}
	if !strings.Contains(log.String(), "level=WARN msg=\"--node-ca is also a --tls-client-ca") {
		t.Errorf("the log:\n%s\nwant a warning that the node CA is the client CA", log.String())
	}
	if strings.Contains(log.String(), code) || strings.Contains(log.String(), "SEKRIT") {
		t.Errorf("the log holds the code or the token:\n%s", log.String())
	}
}

// verifyListenerCert checks that the PEM certificate in name is a server
// certificate ca signed for host.
func verifyListenerCert(name string, ca *certs.CA, host string) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return errors.New("no PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return err
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: host})
	return err
}

// TestReadNodeNames: --node-names takes MAC NAME lines and refuses a line
// that is not one, naming it.
func TestReadNodeNames(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("# rack 1\n52:54:00:00:00:0A rack1-a\n\n52:54:00:00:00:0b rack1-b # spare\n"), 0o644)
	names, err := readNodeNames(good)
	if err != nil || len(names) != 2 || names["52:54:00:00:00:0a"] != "rack1-a" || names["52:54:00:00:00:0b"] != "rack1-b" {
		t.Errorf("readNodeNames = %v, %v; want the two names by MAC in lower case", names, err)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"a wildcard", "52:54:00:00:00:0a *.example.com\n", ":1: "},
		{"an escape", "52:54:00:00:00:0a a\x1b[2K\n", ":1: "},
		{"not a MAC", "# x\nnode1 rack1-a\n", ":2: "},
		{"three fields", "52:54:00:00:00:0a rack1-a 10.0.0.1\n", "want MAC NAME"},
		{"a MAC twice", "52:54:00:00:00:0a a\n52:54:00:00:00:0A b\n", "named twice"},
	} {
		f := filepath.Join(dir, "bad")
		os.WriteFile(f, []byte(tc.text), 0o644)
		if _, err := readNodeNames(f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: readNodeNames = %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestEnrollSecretOwner: 21b finding 9. A 0600 key or code file of another
// user is refused, naming the owner: that user could replace it.
func TestEnrollSecretOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	dir := t.TempDir()
	key, codes := filepath.Join(dir, "enroll.key"), filepath.Join(dir, "codes")
	for _, f := range []string{key, codes} {
		if err := os.WriteFile(f, []byte("52:54:00:00:00:09 ABCDEFGHJKMNPQRSTVWX\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkSecretFile("--enroll-key", key); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("checkSecretFile(a 0600 key of uid 65534) = %v; want refused, naming the owner", err)
	}
	if _, err := readCodes(codes, time.Now(), io.Discard); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("readCodes(a 0600 file of uid 65534) = %v; want refused, naming the owner", err)
	}
	os.Chown(key, 0, 0)
	if err := checkSecretFile("--enroll-key", key); err != nil {
		t.Errorf("checkSecretFile(a 0600 key of root) = %v", err)
	}
}
