package enroll

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/internal/refusal"
)

// bed is a running server and what its clients need.
type bed struct {
	srv    *Server
	addr   string
	pool   *x509.CertPool
	nodeCA *certs.CA
	secret Secrets
}

func newBed(t *testing.T, mod func(*Config)) *bed {
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
	b := &bed{pool: ca.Pool(), nodeCA: nodeCA,
		secret: Secrets{Token: "the-bot-token", ClientCA: certs.CertPEM(ca.Cert), EtcdKey: []byte("etcd key")}}
	cfg := Config{Cert: sc.TLS(), NodeCA: nodeCA, NodeNames: map[string]string{"52:54:00:12:34:56": "node7"}, Secrets: b.secret,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	if mod != nil {
		mod(&cfg)
	}
	if b.srv, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := b.srv.Serve(ctx, l); err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return b
}

func (b *bed) client(t *testing.T, mac string) *Client {
	t.Helper()
	k, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return &Client{Addr: b.addr, CA: b.pool, Key: k, Name: "node-" + strings.ReplaceAll(mac, ":", ""), MAC: mac, Addrs: []string{"10.0.2.15"}}
}

type result struct {
	sec *Secrets
	err error
}

// start sends c's request; the returned channel has the outcome, after
// pending was closed if the request waited.
func start(c *Client, code string) (pending chan struct{}, out chan result) {
	pending, out = make(chan struct{}), make(chan result, 1)
	go func() {
		sec, err := c.Enroll(context.Background(), code, func() { close(pending) })
		out <- result{sec, err}
	}()
	return pending, out
}

func waitPending(t *testing.T, pending chan struct{}, out chan result) {
	t.Helper()
	select {
	case <-pending:
	case r := <-out:
		t.Fatalf("Enroll = %v, %v; want it pending", r.sec, r.err)
	case <-time.After(time.Minute):
		t.Fatal("no pending reply within a minute")
	}
}

func outcome(t *testing.T, out chan result) result {
	t.Helper()
	select {
	case r := <-out:
		return r
	case <-time.After(time.Minute):
		t.Fatal("no outcome within a minute")
	}
	return result{}
}

func TestApprove(t *testing.T) {
	b := newBed(t, nil)
	c := b.client(t, "52:54:00:12:34:56")
	pending, out := start(c, "")
	waitPending(t, pending, out)
	fp := c.Fingerprint()
	line := string(b.srv.pendingText())
	if f := strings.Fields(line); len(f) != 6 || f[0] != fp || f[1] != "52:54:00:12:34:56" || f[2] != "127.0.0.1" || f[4] != "node7" || f[5] != "node-525400123456" {
		t.Errorf("pending = %q; want %q 52:54:00:12:34:56 127.0.0.1 SINCE node7 node-525400123456", line, fp)
	}
	if err := b.srv.command("approve " + fp); err != nil {
		t.Fatalf("approve = %v", err)
	}
	r := outcome(t, out)
	if r.err != nil {
		t.Fatalf("Enroll = %v; want the secrets", r.err)
	}
	if r.sec.Token != b.secret.Token || string(r.sec.EtcdKey) != "etcd key" || string(r.sec.ClientCA) != string(b.secret.ClientCA) {
		t.Errorf("secrets = %+v; want the server's", r.sec)
	}
	blk, _ := pem.Decode(r.sec.ListenerCert)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: b.nodeCA.Pool(), DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("listener certificate: %v; want one the node CA signed for 127.0.0.1", err)
	}
	// The name --node-names gives the MAC and the address the request
	// came from; not the addresses the node reported (10.0.2.15).
	if cert.Subject.CommonName != "node7" || !slices.Equal(cert.DNSNames, []string{"node7"}) || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("listener certificate CN %q, DNS %v, IP %v; want node7, [node7], [127.0.0.1]", cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses)
	}
	if p := b.srv.pendingText(); len(p) != 0 {
		t.Errorf("pending after approval = %q; want empty", p)
	}
	if e := string(b.srv.enrolledText()); !strings.HasPrefix(e, fp+" node7 52:54:00:12:34:56 127.0.0.1 approved ") {
		t.Errorf("enrolled = %q", e)
	}

	// The same key again: an enrolled key is served once.
	_, err = c.Enroll(context.Background(), "", nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already enrolled") {
		t.Errorf("second Enroll = %v; want refused, already enrolled", err)
	}
	if err := b.srv.Approve(fp); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Approve(enrolled) = %v; want invalid", err)
	}
}

func TestOtherKeyGetsNothing(t *testing.T) {
	b := newBed(t, nil)
	good, other := b.client(t, "52:54:00:00:00:01"), b.client(t, "52:54:00:00:00:01")
	gp, gout := start(good, "")
	op, oout := start(other, "")
	waitPending(t, gp, gout)
	waitPending(t, op, oout)
	if err := b.srv.Approve(good.Fingerprint()); err != nil {
		t.Fatal(err)
	}
	if r := outcome(t, gout); r.err != nil {
		t.Fatalf("approved Enroll = %v", r.err)
	}
	select {
	case r := <-oout:
		t.Fatalf("the other key's Enroll = %+v, %v after another key's approval; want it waiting", r.sec, r.err)
	default:
	}
	if p := string(b.srv.pendingText()); !strings.HasPrefix(p, other.Fingerprint()+" ") {
		t.Errorf("pending = %q; want the other key", p)
	}
	if err := b.srv.command("deny " + other.Fingerprint()); err != nil {
		t.Fatal(err)
	}
	if r := outcome(t, oout); !errors.Is(r.err, ErrRefused) || r.sec != nil {
		t.Errorf("denied Enroll = %+v, %v; want refused, nothing", r.sec, r.err)
	}
	if _, err := other.Enroll(context.Background(), "", nil); !errors.Is(err, ErrRefused) {
		t.Errorf("Enroll after deny = %v; want refused", err)
	}
	if err := b.srv.Approve(other.Fingerprint()); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Approve(denied) = %v; want permission denied", err)
	}
}

func TestCode(t *testing.T) {
	code, err := NewCode()
	if err != nil {
		t.Fatal(err)
	}
	b := newBed(t, func(c *Config) {
		c.Codes = []Code{
			{For: "52:54:00:00:00:0a", Code: code, Expires: time.Now().Add(time.Hour)},
			{For: "52:54:00:00:00:0b", Code: "EXPIRED-CODE-0001", Expires: time.Now().Add(-time.Second)},
			{For: "node-x", Code: "NAMED-CODE-000001", Expires: time.Now().Add(time.Hour)},
		}
	})
	// Typed in lower case, without dashes: the same code.
	c := b.client(t, "52:54:00:00:00:0A")
	sec, err := c.Enroll(context.Background(), strings.ToLower(strings.ReplaceAll(code, "-", "")), nil)
	if err != nil || sec.Token != b.secret.Token {
		t.Fatalf("Enroll with the code = %v, %v; want the secrets without approval", sec, err)
	}
	if e := string(b.srv.enrolledText()); !strings.Contains(e, " code ") {
		t.Errorf("enrolled = %q; want by code", e)
	}
	for _, tc := range []struct {
		name, mac, code string
	}{
		{"reused", "52:54:00:00:00:0a", code},
		{"expired", "52:54:00:00:00:0b", "EXPIRED-CODE-0001"},
		{"another node's", "52:54:00:00:00:0c", "NAMED-CODE-000001"},
		{"spent by the wrong node", "52:54:00:00:00:0c", "NAMED-CODE-000001"},
		{"unknown", "52:54:00:00:00:0c", "NOPE-NOPE-NOPE-NOPE"},
	} {
		c := b.client(t, tc.mac)
		if tc.name == "spent by the wrong node" {
			c.Name = "node-x"
		}
		if sec, err := c.Enroll(context.Background(), tc.code, nil); !errors.Is(err, ErrRefused) || sec != nil {
			t.Errorf("%s code: Enroll = %+v, %v; want refused", tc.name, sec, err)
		}
	}
	// The code never shows in the tree.
	if ev := readLog(b.srv); strings.Contains(ev, code) || strings.Contains(ev, "NAMED-CODE") {
		t.Errorf("events hold a code:\n%s", ev)
	}
	if _, err := New(Config{Cert: tls.Certificate{Certificate: [][]byte{{1}}}, NodeCA: b.nodeCA, Codes: []Code{{For: "x", Code: "short"}}}); err == nil {
		t.Error("New with a 5-character code = nil; want refused")
	}
}

func readLog(s *Server) string {
	p := make([]byte, s.events.Size())
	n, _ := s.events.ReadAt(p, 0)
	return string(p[:n])
}

// TestBadRequests: malformed requests are refused with a reason and the
// server goes on.
func TestBadRequests(t *testing.T) {
	b := newBed(t, nil)
	c := b.client(t, "52:54:00:00:00:03")
	stranger, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	strangerCSR, err := csr(stranger, "x")
	if err != nil {
		t.Fatal(err)
	}
	good, err := csr(c.Key, "x")
	if err != nil {
		t.Fatal(err)
	}
	badSig := append([]byte(nil), good...)
	badSig[len(badSig)-3] ^= 0xff
	for _, tc := range []struct{ name, line, want string }{
		{"not JSON", "GET / HTTP/1.0\n", "malformed"},
		{"no CSR", `{"name":"x"}` + "\n", "CSR"},
		{"garbage CSR", `{"csr":"AAEC"}` + "\n", "CSR"},
		{"a CSR for another key", mustJSON(Request{CSR: strangerCSR}), "not for the key"},
		{"a CSR with a bad signature", mustJSON(Request{CSR: badSig}), "CSR"},
		{"a line too long", strings.Repeat("x", MaxRequest+10), "malformed"},
	} {
		r := rawRequest(t, b, c, tc.line)
		if r.Status != StatusRefused || !strings.Contains(r.Error, tc.want) || r.Secrets != nil {
			t.Errorf("%s: reply = %+v; want refused, %q", tc.name, r, tc.want)
		}
	}
	// The server still serves.
	pending, out := start(c, "")
	waitPending(t, pending, out)
	b.srv.Approve(c.Fingerprint())
	if r := outcome(t, out); r.err != nil {
		t.Errorf("Enroll after bad requests = %v", r.err)
	}
	for _, line := range []string{"approve", "approve sha256:12", "frob " + c.Fingerprint(), "approve " + strings.ToUpper(c.Fingerprint())} {
		if err := b.srv.command(line); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("ctl %q = %v; want invalid", line, err)
		}
	}
	if err := b.srv.command("approve sha256:" + strings.Repeat("0", 64)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("approve of no request = %v; want not found", err)
	}
}

func mustJSON(r Request) string {
	b, _ := json.Marshal(r)
	return string(b) + "\n"
}

// rawRequest sends line as c's request over TLS and returns the reply.
func rawRequest(t *testing.T, b *bed, c *Client, line string) Reply {
	t.Helper()
	self, err := selfSigned(c.Key, "x")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", b.addr, &tls.Config{RootCAs: b.pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{self}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	go conn.Write([]byte(line))
	var r Reply
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&r); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	return r
}

// TestFlood: the pending list is bounded; a request beyond it is refused
// at once, and approval still works.
func TestFlood(t *testing.T) {
	const max = 4
	b := newBed(t, func(c *Config) { c.MaxPending = max; c.MaxPerAddr = 64 })
	var outs []chan result
	var first *Client
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range max {
		c := b.client(t, "52:54:00:00:01:0"+string(rune('0'+i)))
		if first == nil {
			first = c
		}
		pending, out := make(chan struct{}), make(chan result, 1)
		wg.Go(func() {
			sec, err := c.Enroll(ctx, "", func() { close(pending) })
			out <- result{sec, err}
		})
		waitPending(t, pending, out)
		outs = append(outs, out)
	}
	extra := b.client(t, "52:54:00:00:01:ff")
	if _, err := extra.Enroll(context.Background(), "", nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "busy") {
		t.Errorf("Enroll beyond %d pending = %v; want refused, busy", max, err)
	}
	// A connection that never finishes its handshake holds no pending
	// place and does not stop others.
	idle, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if err := b.srv.Approve(first.Fingerprint()); err != nil {
		t.Fatal(err)
	}
	if r := outcome(t, outs[0]); r.err != nil {
		t.Errorf("approved Enroll under a full list = %v", r.err)
	}
	if n := strings.Count(string(b.srv.pendingText()), "\n"); n != max-1 {
		t.Errorf("pending lines = %d; want %d", n, max-1)
	}
}

// TestPerAddressLimit: connections from one address beyond MaxPerAddr
// are closed at once, and the refusal is logged.
func TestPerAddressLimit(t *testing.T) {
	const max = 3
	b := newBed(t, func(c *Config) { c.MaxPerAddr = max })
	var held []net.Conn
	for range max {
		c, err := net.Dial("tcp", b.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	c := b.client(t, "52:54:00:00:02:01")
	if _, err := c.Enroll(context.Background(), "", nil); err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("Enroll with %d stalled connections from its address = %v; want the connection closed", max, err)
	}
	if ev := readLog(b.srv); !strings.Contains(ev, "busy: 3 connections in their handshake from this address") {
		t.Errorf("events:\n%s\nwant the refusal", ev)
	}
	for _, h := range held {
		h.Close()
	}
}

// TestServerChoosesNames: the listener certificate names what the server
// decides (pxe- and the MAC here, none in --node-names), and the address
// the request came from; never the name or addresses the node sent, which
// /enroll/pending shows beside the name that will be issued.
func TestServerChoosesNames(t *testing.T) {
	b := newBed(t, nil)
	c := b.client(t, "52:54:00:aa:bb:cc")
	c.Name, c.Addrs = "admin", []string{"10.9.9.9", "192.0.2.1"}
	pending, out := start(c, "")
	waitPending(t, pending, out)
	if p := string(b.srv.pendingText()); !strings.HasSuffix(p, " pxe-52-54-00-aa-bb-cc admin\n") {
		t.Errorf("pending = %q; want the name to be issued, pxe-52-54-00-aa-bb-cc, then the requested admin", p)
	}
	if err := b.srv.Approve(c.Fingerprint()); err != nil {
		t.Fatal(err)
	}
	r := outcome(t, out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	cert := parseCert(t, r.sec.ListenerCert)
	if cert.Subject.CommonName != "pxe-52-54-00-aa-bb-cc" || !slices.Equal(cert.DNSNames, []string{"pxe-52-54-00-aa-bb-cc"}) || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("listener certificate CN %q, DNS %v, IP %v; want pxe-52-54-00-aa-bb-cc, [pxe-52-54-00-aa-bb-cc], [127.0.0.1]", cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses)
	}
}

func parseCert(t *testing.T, p []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(p)
	if blk == nil {
		t.Fatalf("%q is not PEM", p)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestBadNodeFields: a request whose MAC is not a MAC, or whose name is
// not a host name (escape sequences, a wildcard, too long), is refused,
// and nothing of it reaches /enroll/events or /enroll/pending raw.
func TestBadNodeFields(t *testing.T) {
	b := newBed(t, nil)
	for _, tc := range []struct{ name, mac, nodeName string }{
		{"an escape in the MAC", "52:54:00:aa:bb:cc\x1b[2K\rsha256:ffff", "n1"},
		{"a MAC of words", "hello", "n1"},
		{"an escape in the name", "52:54:00:aa:bb:cc", "node1\x1b[2K\r"},
		{"a wildcard name", "52:54:00:aa:bb:cc", "*.example.com"},
		{"a space in the name", "52:54:00:aa:bb:cc", "node 1"},
		{"a name too long", "52:54:00:aa:bb:cc", strings.Repeat("a", MaxName+1)},
	} {
		c := b.client(t, "52:54:00:aa:bb:cc")
		req, err := csr(c.Key, "x")
		if err != nil {
			t.Fatal(err)
		}
		r := rawRequest(t, b, c, mustJSON(Request{Name: tc.nodeName, MAC: tc.mac, CSR: req}))
		if r.Status != StatusRefused || !strings.Contains(r.Error, "malformed") {
			t.Errorf("%s: reply = %+v; want refused, malformed", tc.name, r)
		}
	}
	// Upper case is a host name's too: the server takes it as lower case.
	c := b.client(t, "52:54:00:aa:bb:cd")
	req, err := csr(c.Key, "x")
	if err != nil {
		t.Fatal(err)
	}
	if r := rawRequest(t, b, c, mustJSON(Request{Name: "Node-UP", MAC: "52:54:00:AA:BB:CD", CSR: req})); r.Status != StatusPending {
		t.Errorf("upper case: reply = %+v; want pending", r)
	}
	if ev := readLog(b.srv); !strings.Contains(ev, "requested=node-up mac=52:54:00:aa:bb:cd ") {
		t.Errorf("events:\n%s\nwant the requested name and the MAC in lower case", ev)
	}
	if ev := readLog(b.srv); strings.ContainsAny(ev, "\x1b\r*") || strings.Contains(ev, "hello") {
		t.Errorf("events hold what the requests carried:\n%q", ev)
	}
}

// TestPendingPerAddress: one address may have MaxPendingPerAddr requests
// waiting; one more is refused at once, and the others still wait.
func TestPendingPerAddress(t *testing.T) {
	const max = 2
	b := newBed(t, func(c *Config) { c.MaxPendingPerAddr = max })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range max {
		c := b.client(t, "52:54:00:00:03:0"+string(rune('0'+i)))
		pending, out := make(chan struct{}), make(chan result, 1)
		wg.Go(func() {
			sec, err := c.Enroll(ctx, "", func() { close(pending) })
			out <- result{sec, err}
		})
		waitPending(t, pending, out)
	}
	extra := b.client(t, "52:54:00:00:03:ff")
	if _, err := extra.Enroll(context.Background(), "", nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "requests from this address wait already") {
		t.Errorf("Enroll beyond %d pending from one address = %v; want refused, busy", max, err)
	}
	if n := strings.Count(string(b.srv.pendingText()), "\n"); n != max {
		t.Errorf("pending lines = %d; want %d", n, max)
	}
}

// TestRefusalsRateLimited: a flood of malformed requests puts
// refusal.Burst lines into /enroll/events in a window and one summary
// line when it ends, and the lines of waiting requests are still logged.
func TestRefusalsRateLimited(t *testing.T) {
	clk := clock.NewFake()
	b := newBed(t, func(c *Config) { c.Clock = clk })
	c := b.client(t, "52:54:00:00:04:01")
	const flood = 3 * refusal.Burst
	for range flood {
		if r := rawRequest(t, b, c, "junk\n"); r.Status != StatusRefused {
			t.Fatalf("junk: reply = %+v; want refused", r)
		}
	}
	if n := strings.Count(readLog(b.srv), "event=refused fingerprint="); n != refusal.Burst {
		t.Errorf("refusal lines after %d junk requests = %d; want %d", flood, n, refusal.Burst)
	}
	clk.Advance(refusal.Window)
	if ev := readLog(b.srv); !strings.Contains(ev, fmt.Sprintf("event=refused reason=malformed suppressed=%d window=1m0s", flood-refusal.Burst)) {
		t.Errorf("events:\n%s\nwant a summary of %d suppressed refusals", ev, flood-refusal.Burst)
	}
	pending, out := start(c, "")
	waitPending(t, pending, out)
	if ev := readLog(b.srv); !strings.Contains(ev, "event=pending fingerprint="+c.Fingerprint()) {
		t.Errorf("events:\n%s\nwant the waiting request's line", ev)
	}
	b.srv.Deny(c.Fingerprint())
	outcome(t, out)
}

// TestPerPrefixLimit: 21b finding 8. Connections in their handshake are
// counted by prefix too (loopback as one, IPv6 by /64): many addresses of
// one host hold at most half of the slots. And the keys.
func TestPerPrefixLimit(t *testing.T) {
	for _, tc := range []struct{ addr, prefix string }{
		{"127.0.0.1", "local"}, {"127.0.9.3", "local"}, {"::1", "local"},
		{"fd00:9::2", "fd00:9::/64"}, {"fd00:9::ffff:3", "fd00:9::/64"},
		{"10.9.1.1", "10.9.1.1"}, {"::ffff:10.9.1.1", "10.9.1.1"},
	} {
		if got := prefixOf(tc.addr); got != tc.prefix {
			t.Errorf("prefixOf(%s) = %q; want %q", tc.addr, got, tc.prefix)
		}
	}
	const perAddr = 2
	b := newBed(t, func(c *Config) { c.MaxPending = 4; c.MaxPerAddr = perAddr }) // slots 20, a prefix 10
	for i := range 5 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}}
		for range perAddr {
			c, err := d.Dial("tcp", b.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
	}
	c := b.client(t, "52:54:00:00:05:01") // from 127.0.0.1, a new address of the full prefix
	if _, err := c.Enroll(context.Background(), "", nil); err == nil || errors.Is(err, ErrRefused) {
		t.Errorf("Enroll with 10 stalled connections from loopback = %v; want the connection closed", err)
	}
	if ev := readLog(b.srv); !strings.Contains(ev, "busy: 10 connections in their handshake from local") {
		t.Errorf("events:\n%s\nwant the refusal", ev)
	}
}

// TestCodeBackoff: 21b finding 11. After codeFreeTries wrong codes from
// one prefix, its codes are refused unread for a pause that doubles; a
// good code sent meanwhile is not spent, and is taken after the pause.
func TestCodeBackoff(t *testing.T) {
	clk := clock.NewFake()
	code, err := NewCode()
	if err != nil {
		t.Fatal(err)
	}
	b := newBed(t, func(c *Config) {
		c.Clock = clk
		c.Codes = []Code{{For: "52:54:00:00:06:01", Code: code, Expires: clk.Now().Add(time.Hour)}}
	})
	c := b.client(t, "52:54:00:00:06:01")
	for i := range codeFreeTries {
		if _, err := c.Enroll(context.Background(), "WRONG-CODE-0000"+string(rune('A'+i)), nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "invalid code") {
			t.Fatalf("wrong code %d = %v; want refused, invalid code", i+1, err)
		}
	}
	if _, err := c.Enroll(context.Background(), code, nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "too many wrong codes from local") {
		t.Fatalf("the good code after %d wrong ones = %v; want refused for a pause", codeFreeTries, err)
	}
	clk.Advance(time.Second)
	if sec, err := c.Enroll(context.Background(), code, nil); err != nil || sec.Token != b.secret.Token {
		t.Errorf("the good code after the pause = %v; want the secrets (not spent by the refused try)", err)
	}
}

// TestWeakCode: 21b finding 11. Operator-written codes that are short,
// of few distinct characters, or under MinCodeBits are refused;
// NewCode's pass.
func TestWeakCode(t *testing.T) {
	for _, tc := range []struct {
		code string
		weak bool
	}{
		{"000000000000", true},
		{"------------a-a-a-a-a-a-a-a-a-a-a-a", true},
		{"rack1-a-2026", true},       // 10 characters once the dashes go
		{"123456789012", true},       // digits: 40 bits
		{"abcabcabcabcabc", true},    // 3 distinct
		{"EXPIRED-CODE-0001", false}, // 15 of 36: 77 bits
		{"k7Qm-x2Rt-9pLw", false},    // 12 of 36: 62 bits
	} {
		if why := WeakCode(tc.code); (why != "") != tc.weak {
			t.Errorf("WeakCode(%q) = %q; want weak %t", tc.code, why, tc.weak)
		}
	}
	for range 100 {
		c, err := NewCode()
		if err != nil {
			t.Fatal(err)
		}
		if why := WeakCode(c); why != "" {
			t.Errorf("WeakCode(NewCode() %q) = %q; want strong", c, why)
		}
	}
}

// TestPendingPerPrefix: 21b finding 8. Waiting requests from the
// addresses of one IPv6 /64 are held to half of MaxPending together;
// another /64, or an IPv4 address, still gets in; a request that goes
// frees its prefix's place.
func TestPendingPerPrefix(t *testing.T) {
	b := newBed(t, func(c *Config) { c.MaxPending = 8; c.MaxPendingPerAddr = 2 }) // a prefix 4
	var held []*request
	for i := range 4 {
		_, r, _, _, why := b.srv.admit(fmt.Sprintf("fp%d", i), fmt.Sprintf("fd00:9::%d", 2+i/2), &Request{MAC: "52:54:00:00:07:01"})
		if r == nil {
			t.Fatalf("request %d from fd00:9::/64: %s; want waiting", i, why)
		}
		held = append(held, r)
	}
	if _, r, _, _, why := b.srv.admit("fp-more", "fd00:9::20", &Request{MAC: "52:54:00:00:07:02"}); r != nil || !strings.Contains(why, "requests from fd00:9::/64 wait already") {
		t.Errorf("a fifth request from fd00:9::/64 (a new address): %q; want refused, busy, naming the /64", why)
	}
	for _, addr := range []string{"fd00:a::1", "10.9.1.1"} {
		if _, r, _, _, why := b.srv.admit("fp-"+addr, addr, &Request{MAC: "52:54:00:00:07:03"}); r == nil {
			t.Errorf("a request from %s: %s; want waiting", addr, why)
		}
	}
	b.srv.forget(held[0])
	if _, r, _, _, why := b.srv.admit("fp-again", "fd00:9::20", &Request{MAC: "52:54:00:00:07:04"}); r == nil {
		t.Errorf("a request from fd00:9::/64 after one went: %s; want waiting", why)
	}
}
