package main

import (
	"crypto/x509"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// parseEtcd parses serve's etcd flags from args.
func parseEtcd(t *testing.T, args ...string) *etcdFlags {
	t.Helper()
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	var e etcdFlags
	e.register(fl)
	if err := fl.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &e
}

// The etcd flags: what needs --etcd, what goes together, and the TLS
// files (CA pool, client key pair) each refused with a line naming the
// flag and the problem.
func TestEtcdFlagsRefused(t *testing.T) {
	pki := testPKI(t)
	f := func(name string) string { return filepath.Join(pki, name) }
	base := []string{"--etcd", "127.0.0.1:2379", "--bot", "b", "--node", "n"}
	for _, tc := range []struct {
		args     []string
		sessions bool
		says     string
	}{
		{[]string{"--bot", "b"}, false, "--bot needs --etcd"},
		{[]string{"--etcd-ca", f("ca.crt")}, false, "--etcd-ca needs --etcd"},
		{[]string{"--etcd-ttl", "5s"}, false, "--etcd-ttl needs --etcd"},
		{[]string{"--fluxer-identify-budget", "100"}, false, "--fluxer-identify-budget needs --etcd"},
		{[]string{"--confirm-delivery=false"}, false, "--confirm-delivery needs --etcd"},
		{[]string{"--etcd", "127.0.0.1:2379"}, false, "--etcd needs --bot"},
		{base, true, "--sessions and --etcd are exclusive"},
		{append(slices.Clone(base), "--etcd-ttl", "1s"), false, "want at least 2s"},
		{append(slices.Clone(base), "--fluxer-identify-budget", "-1"), false, "--fluxer-identify-budget -1"},
		{append(slices.Clone(base), "--etcd-cert", f("client.crt")), false, "--etcd-cert and --etcd-key go together"},
		{append(slices.Clone(base), "--etcd-key", f("client.key")), false, "--etcd-cert and --etcd-key go together"},
		{append(slices.Clone(base), "--etcd-ca", f("gone.crt")), false, "--etcd-ca: open " + f("gone.crt")},
		{append(slices.Clone(base), "--etcd-ca", f("client.key")), false, "no PEM certificate"},
		{append(slices.Clone(base), "--etcd-cert", f("client.crt"), "--etcd-key", f("stranger.key")), false, "--etcd-cert/--etcd-key"},
		{append(slices.Clone(base), "--etcd-cert", f("client.crt"), "--etcd-key", f("gone.key")), false, "gone.key"},
	} {
		cfg, err := parseEtcd(t, tc.args...).config(tc.sessions)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: config = %+v, %v; want an error containing %q", tc.args, cfg, err, tc.says)
		}
	}
}

// Good etcd flags: endpoints split and trimmed, the TLS configuration
// carries the CA and the client's key pair, and no --etcd means no fleet.
func TestEtcdFlagsConfig(t *testing.T) {
	if cfg, err := parseEtcd(t).config(true); cfg != nil || err != nil {
		t.Fatalf("no --etcd: %+v, %v; want nil, nil", cfg, err)
	}
	pki := testPKI(t)
	cfg, err := parseEtcd(t, "--etcd", " https://10.0.0.1:2379, https://10.0.0.2:2379,,", "--bot", "b", "--node", "n1",
		"--etcd-ttl", "4s", "--fluxer-identify-budget", "100",
		"--etcd-ca", filepath.Join(pki, "ca.crt"), "--etcd-cert", filepath.Join(pki, "client.crt"), "--etcd-key", filepath.Join(pki, "client.key")).config(false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}; !slices.Equal(cfg.Endpoints, want) {
		t.Errorf("endpoints %q, want %q", cfg.Endpoints, want)
	}
	if cfg.Bot != "b" || cfg.Node != "n1" || cfg.TTL != 4*time.Second || cfg.FluxerIdentifyBudget != 100 || cfg.Unconfirmed {
		t.Errorf("config %+v", cfg)
	}
	if cfg.TLS == nil || cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 1 {
		t.Fatalf("TLS %+v; want the CA pool and one client certificate", cfg.TLS)
	}
	leaf, err := x509.ParseCertificate(cfg.TLS.Certificates[0].Certificate[0])
	if err != nil || leaf.Subject.CommonName != "client" {
		t.Fatalf("client certificate %v, %v; want client", leaf.Subject, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cfg.TLS.RootCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the client certificate does not verify against --etcd-ca's pool: %v", err)
	}
	// CA only: server authentication without a client certificate.
	cfg, err = parseEtcd(t, "--etcd", "https://10.0.0.1:2379", "--bot", "b", "--node", "n1", "--etcd-ca", filepath.Join(pki, "ca.crt")).config(false)
	if err != nil || cfg.TLS == nil || cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 0 {
		t.Fatalf("CA only: %+v, %v", cfg, err)
	}
	// Confirmed delivery is on unless turned off.
	if cfg, err := parseEtcd(t, "--etcd", "127.0.0.1:2379", "--bot", "b", "--node", "n1", "--confirm-delivery=false").config(false); err != nil || !cfg.Unconfirmed {
		t.Fatalf("--confirm-delivery=false: %+v, %v; want Unconfirmed", cfg, err)
	}
	// No --node: the host name.
	host, _ := os.Hostname()
	if cfg, err := parseEtcd(t, "--etcd", "127.0.0.1:2379", "--bot", "b").config(false); err != nil || cfg.Node != host || cfg.TLS != nil {
		t.Fatalf("no --node: %+v, %v; want node %q, no TLS", cfg, err, host)
	}
}

// Issue 21 item 5: plain http:// to etcd on another host is refused unless
// --etcd-insecure (it was accepted silently); loopback, unix sockets,
// https and a schemeless endpoint under TLS pass.
func TestEtcdPlainBeyondLoopbackRefused(t *testing.T) {
	pki := testPKI(t)
	ca := filepath.Join(pki, "ca.crt")
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--etcd", "http://10.0.0.5:2379"}, false},
		{[]string{"--etcd", "10.0.0.5:2379"}, false},
		{[]string{"--etcd", "http://etcd.example:2379"}, false},
		{[]string{"--etcd", "http://127.0.0.1:2379,http://10.0.0.5:2379"}, false},
		{[]string{"--etcd", "http://10.0.0.5:2379", "--etcd-ca", ca}, false}, // http:// is plain whatever the TLS flags
		{[]string{"--etcd", "http://10.0.0.5:2379", "--etcd-insecure"}, true},
		{[]string{"--etcd", "http://127.0.0.1:2379"}, true},
		{[]string{"--etcd", "http://[::1]:2379"}, true},
		{[]string{"--etcd", "localhost:2379"}, true},
		{[]string{"--etcd", "unix:///run/etcd.sock"}, true},
		{[]string{"--etcd", "https://10.0.0.5:2379"}, true},
		{[]string{"--etcd", "10.0.0.5:2379", "--etcd-ca", ca}, true},
	} {
		cfg, err := parseEtcd(t, append(tc.args, "--bot", "b", "--node", "n")...).config(false)
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "--etcd-insecure")) {
			t.Errorf("%v: config = %+v, %v; want ok %v (a refusal naming --etcd-insecure)", tc.args, cfg, err, tc.ok)
		}
	}
	if _, err := parseEtcd(t, "--etcd-insecure").config(false); err == nil || !strings.Contains(err.Error(), "--etcd-insecure needs --etcd") {
		t.Errorf("--etcd-insecure alone = %v; want it to need --etcd", err)
	}
}

// --etcd-user takes its password from --etcd-password-file (trailing
// newline dropped) or SHARDFS_ETCD_PASSWORD, never from the command line;
// without either it is refused.
func TestEtcdUser(t *testing.T) {
	base := []string{"--etcd", "127.0.0.1:2379", "--bot", "b", "--node", "n"}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseEtcd(t, append(slices.Clone(base), "--etcd-user", "shardfs-b", "--etcd-password-file", pw)...).config(false)
	if err != nil || cfg.Username != "shardfs-b" || cfg.Password != "s3cret" {
		t.Fatalf("--etcd-password-file: user %q, password set %v, %v", cfg.Username, cfg.Password == "s3cret", err)
	}
	t.Setenv(etcdPasswordEnv, "from-env")
	cfg, err = parseEtcd(t, append(slices.Clone(base), "--etcd-user", "shardfs-b")...).config(false)
	if err != nil || cfg.Password != "from-env" {
		t.Fatalf("%s: password set %v, %v", etcdPasswordEnv, cfg != nil && cfg.Password == "from-env", err)
	}
	// It stays set: serve re-executes itself (dropping SHARDFS_TOKEN)
	// after reading its flags, and the new image reads it again.
	if got := os.Getenv(etcdPasswordEnv); got != "from-env" {
		t.Errorf("%s = %q after config; want it kept for serve's re-exec", etcdPasswordEnv, got)
	}
	os.Unsetenv(etcdPasswordEnv)
	// Checked as --token-file is: mode and owner.
	open := filepath.Join(filepath.Dir(pw), "pw-0644")
	if err := os.WriteFile(open, []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--etcd-user", "u"}, "no password"},
		{[]string{"--etcd-password-file", pw}, "--etcd-password-file needs --etcd-user"},
		{[]string{"--etcd-user", "u", "--etcd-password-file", pw + ".gone"}, "--etcd-password-file: open"},
		{[]string{"--etcd-user", "u", "--etcd-password-file", open}, "mode 0644 lets other users read"},
	} {
		if _, err := parseEtcd(t, append(slices.Clone(base), tc.args...)...).config(false); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v; want an error containing %q", tc.args, err, tc.says)
		}
	}
	if _, err := parseEtcd(t, "--etcd-user", "u").config(false); err == nil || !strings.Contains(err.Error(), "--etcd-user needs --etcd") {
		t.Errorf("--etcd-user alone = %v; want it to need --etcd", err)
	}
}

// The etcd password, like the token, is read only once the process is
// not dumpable: a process of the same user cannot read it from memory.
func TestEtcdPasswordReadNotDumpable(t *testing.T) {
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) })
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := parseEtcd(t, "--etcd", "127.0.0.1:2379", "--bot", "b", "--node", "n", "--etcd-user", "u", "--etcd-password-file", pw).config(false); err != nil {
		t.Fatal(err)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("after reading --etcd-password-file PR_GET_DUMPABLE = %d, %v; want 0", d, err)
	}
}
