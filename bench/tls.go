package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"
)

// wire is how a comparison's clients reach the simulator: over TLS when
// trust is set, and (shardfs only) with a transport compression.
type wire struct {
	trust       *trust
	compression string // "" or "zlib-stream"
}

// trust is a certificate authority made for one run of the harness and the
// simulator's certificate it signed, in a temporary directory.
//
// Every client, shardfs and the peers alike, trusts the CA the same way:
// SSL_CERT_FILE names the CA's file and SSL_CERT_DIR a directory holding
// only it, which crypto/x509 reads on Linux instead of the system bundle.
// That works for all three because none is given a root pool of its own:
// shardfs's gateway transport dials with a tls.Config without RootCAs and
// discovers through an http.Client on the default transport; discordgo
// v0.29.0 uses websocket.DefaultDialer and an http.Client with the default
// transport; disgo v0.18.15 uses websocket.DefaultDialer. All of them
// therefore verify against the system roots, which the variables replace,
// and TestTLSTrust checks that without them the peers' handshakes fail.
type trust struct {
	dir       string
	caFile    string // the CA certificate, PEM
	caDir     string // a directory holding only caFile
	serverDir string // cert.pem and key.pem for the simulator
}

func newTrust() (*trust, error) {
	dir, err := os.MkdirTemp("", "shardfs-bench-tls-")
	if err != nil {
		return nil, err
	}
	t := &trust{dir: dir, caDir: filepath.Join(dir, "ca"), serverDir: filepath.Join(dir, "server")}
	t.caFile = filepath.Join(t.caDir, "ca.pem")
	if err := t.generate(); err != nil {
		t.remove()
		return nil, err
	}
	return t, nil
}

// generate makes an ECDSA P-256 CA and a server certificate for 127.0.0.1
// signed by it, both valid for a day around now.
func (t *trust) generate() error {
	for _, d := range []string{t.caDir, t.serverDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shardfs bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "gateway simulator"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	files := []struct {
		path, kind string
		der        []byte
	}{
		{t.caFile, "CERTIFICATE", caDER},
		{filepath.Join(t.serverDir, "cert.pem"), "CERTIFICATE", der},
		{filepath.Join(t.serverDir, "key.pem"), "EC PRIVATE KEY", keyDER},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// env is what a client's environment needs to trust the CA.
func (t *trust) env() []string {
	return []string{"SSL_CERT_FILE=" + t.caFile, "SSL_CERT_DIR=" + t.caDir}
}

func (t *trust) remove() { _ = os.RemoveAll(t.dir) }

// breakdownRate is the MemProfileRate of the runs whose heap is summed by
// package: one sample per 4 KiB allocated, fine enough for objects of a
// few hundred bytes per connection.
const breakdownRate = 4096

// heapBreakdown is the heapsum command: the Go heap in use, after two
// collections, summed by the package that allocated it, largest first, as
// "package=bytes ...". The package is that of the innermost frame outside
// the runtime and the standard library's containers and codecs (bytes,
// bufio, encoding/json, ...), so that a buffer is charged to the code that
// asked for it. Sampled sizes are scaled as pprof scales them.
func heapBreakdown([]string) (string, error) {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	by := map[string]float64{}
	for i := range recs {
		r := &recs[i]
		inuse := r.InUseBytes()
		if inuse <= 0 || r.AllocObjects == 0 {
			continue
		}
		scale := 1.0
		if rate > 1 {
			avg := float64(r.AllocBytes) / float64(r.AllocObjects)
			scale = 1 / (1 - math.Exp(-avg/rate))
		}
		by[allocPackage(r.Stack())] += float64(inuse) * scale
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(by[b] - by[a]) })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%.0f ", k, by[k])
	}
	unused := []metrics.Sample{{Name: "/memory/classes/heap/unused:bytes"}}
	metrics.Read(unused)
	if unused[0].Value.Kind() == metrics.KindUint64 {
		fmt.Fprintf(&b, "%s=%d", unusedKey, unused[0].Value.Uint64())
	}
	return strings.TrimSpace(b.String()), nil
}

// passThrough are the packages whose allocations are charged to their
// caller, as are crypto's below crypto/tls.
var passThrough = []string{"runtime", "bytes", "bufio", "strings", "sync", "internal/", "reflect", "io", "slices", "maps", "encoding/json", "fmt", "strconv", "github.com/disgoorg/json"}

func allocPackage(stack []uintptr) string {
	frames := runtime.CallersFrames(stack)
	first := ""
	for {
		f, more := frames.Next()
		pkg := funcPackage(f.Function)
		if first == "" {
			first = pkg
		}
		// crypto/tls's keys are built by the ciphers and hashes it calls.
		pass := strings.HasPrefix(pkg, "crypto/") && pkg != "crypto/tls"
		for _, p := range passThrough {
			if pkg == p || strings.HasSuffix(p, "/") && strings.HasPrefix(pkg, p) {
				pass = true
				break
			}
		}
		if pkg == "crypto/tls" {
			return tlsPart(f.Function)
		}
		if !pass && pkg != "" {
			return shortPackage(pkg)
		}
		if !more {
			return shortPackage(first)
		}
	}
}

// tlsPart names what crypto/tls allocated from the function that did:
// the Conn itself, its keys and secrets, the buffer records are read into
// (rawInput, which keeps the room of the largest record read so far), the
// buffer handshake messages are gathered in (hand, which keeps its room
// after the handshake), or other.
func tlsPart(fn string) string {
	name := strings.TrimPrefix(fn, "crypto/tls.")
	switch {
	case name == "Client" || name == "Server":
		return tlsPrefix + "Conn"
	case strings.Contains(name, "readFromUntil"):
		return tlsPrefix + "record-buffer"
	case strings.Contains(name, "readRecordOrCCS"), strings.Contains(name, "readHandshake"):
		return tlsPrefix + "handshake-buffer"
	case strings.Contains(name, "aead"), strings.Contains(name, "cipherSuite"), strings.Contains(name, "trafficKey"),
		strings.Contains(name, "Secret"), strings.Contains(name, "setTrafficSecret"):
		return tlsPrefix + "keys"
	}
	return tlsPrefix + "other"
}

// tlsPrefix begins the heapsum keys of crypto/tls's parts.
const tlsPrefix = "crypto/tls:"

// unusedKey is heapsum's key for the room in the heap's in-use spans that
// no object takes (/memory/classes/heap/unused).
const unusedKey = "~unused"

// tlsTotal is what crypto/tls holds in a breakdown, all parts.
func tlsTotal(by map[string]float64) float64 {
	t := 0.0
	for k, v := range by {
		if strings.HasPrefix(k, tlsPrefix) {
			t += v
		}
	}
	return t
}

// funcPackage is the import path of a function's package: the name up to
// the first dot after its last slash.
func funcPackage(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	if dot := strings.IndexByte(fn[slash+1:], '.'); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}

func shortPackage(p string) string {
	p = strings.TrimPrefix(p, "github.com/shardfs/")
	return strings.TrimPrefix(p, "github.com/")
}

// heapBreakdown asks a client for heapsum and adds it, per shard, to into.
func (c *client) heapBreakdown(n int, into map[string]float64) error {
	out, err := c.call(time.Minute, "heapsum")
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(out) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("heapsum: %q", f)
		}
		b, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("heapsum: %q: %w", f, err)
		}
		into[k] += b / float64(n)
	}
	return nil
}

// breakdownText renders a heapsum per shard: the largest packages, the
// rest summed; crypto/tls as one package, its parts in parentheses; then
// the room the heap's spans hold unused.
func breakdownText(by map[string]float64, top int) string {
	keys := make([]string, 0, len(by))
	total := 0.0
	hasTLS := false
	for k, v := range by {
		switch {
		case k == unusedKey:
			continue
		case strings.HasPrefix(k, tlsPrefix):
			hasTLS = true
			total += v
			continue
		}
		keys = append(keys, k)
		total += v
	}
	if hasTLS {
		keys = append(keys, "crypto/tls")
		by = maps.Clone(by)
		by["crypto/tls"] = tlsTotal(by)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if by[a] != by[b] {
			if by[a] > by[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	rest := 0.0
	for i, k := range keys {
		if i < top {
			p := fmt.Sprintf("%s %s B", k, num(by[k], 0))
			if k == "crypto/tls" {
				p += " (" + tlsPartsText(by) + ")"
			}
			parts = append(parts, p)
		} else {
			rest += by[k]
		}
	}
	if rest > 0 {
		parts = append(parts, fmt.Sprintf("other %s B", num(rest, 0)))
	}
	s := fmt.Sprintf("%s B in all: %s", num(total, 0), strings.Join(parts, ", "))
	if u, ok := by[unusedKey]; ok {
		s += fmt.Sprintf("; and %s B of room in the heap's in-use spans that no object takes", num(u, 0))
	}
	return s
}

// partsText lists crypto/tls's parts, largest first.
func partsText(parts map[string]float64) string {
	keys := slices.Collect(maps.Keys(parts))
	slices.SortFunc(keys, func(a, b string) int {
		if parts[a] != parts[b] {
			if parts[a] > parts[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s %s B", strings.ReplaceAll(k, "-", " "), num(parts[k], 0)))
	}
	return strings.Join(out, ", ")
}

// tlsPartsText lists crypto/tls's parts in a breakdown.
func tlsPartsText(by map[string]float64) string {
	parts := map[string]float64{}
	for k, v := range by {
		if p, ok := strings.CutPrefix(k, tlsPrefix); ok {
			parts[p] = v
		}
	}
	return partsText(parts)
}
