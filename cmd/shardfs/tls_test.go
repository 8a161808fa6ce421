package main

import (
	"context"
	"crypto/x509"
	pem2 "encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// testPKI writes a CA, a server certificate for 127.0.0.1, a client
// certificate, an expired client certificate and a CA of another into dir.
func testPKI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := certs.NewCA("test CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("another CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		name string
		ca   *certs.CA
		kind certs.Kind
		v    certs.Validity
	}{
		{"server", ca, certs.Server, certs.Validity{}},
		{"client", ca, certs.Client, certs.Validity{}},
		{"expired", ca, certs.Client, certs.Validity{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}},
		{"stranger", other, certs.Client, certs.Validity{}},
	} {
		i, err := c.ca.Issue(c.kind, c.name, []string{"127.0.0.1"}, c.v)
		if err != nil {
			t.Fatal(err)
		}
		if err := certs.WriteFiles(filepath.Join(dir, c.name), i.Cert, i.Key); err != nil {
			t.Fatal(err)
		}
	}
	if err := certs.WriteFiles(filepath.Join(dir, "ca"), ca.Cert, ca.Key); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serveDemoTLS serves a one-shard demo on tls!127.0.0.1!PORT (opts after
// it) until the test ends and returns the address.
func serveDemoTLS(t *testing.T, pki, opts string) string {
	t.Helper()
	d, err := demo.Start(context.Background(), demo.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := fsrv.ServerTLSConfig(filepath.Join(pki, "server.crt"), filepath.Join(pki, "server.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := fsrv.ListenTLS("tls!127.0.0.1!0"+opts, conf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		<-served
		d.Close()
	})
	return fsrv.AddrString(l)
}

func clientArgs(pki, cert string) []string {
	return []string{"--cert", filepath.Join(pki, cert+".crt"), "--key", filepath.Join(pki, cert+".key"), "--ca", filepath.Join(pki, "ca.crt")}
}

// The built-in client over TLS: it reads with a good certificate, and
// each failure says what failed.
func TestClientTLS(t *testing.T) {
	pki := testPKI(t)
	addr := serveDemoTLS(t, pki, "")
	if !strings.HasPrefix(addr, "tls!127.0.0.1!") {
		t.Fatalf("addrString of a TLS listener = %q; want tls!127.0.0.1!PORT", addr)
	}
	_, port, _ := strings.Cut(strings.TrimPrefix(addr, "tls!"), "!")
	shardfs := func(args ...string) (string, error) {
		var out, errb strings.Builder
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		return out.String() + errb.String(), err
	}
	out, err := shardfs(append(append([]string{"cat", "--addr", addr}, clientArgs(pki, "client")...), "plan")...)
	if err != nil || !strings.Contains(out, "flavor discord") {
		t.Fatalf("shardfs cat plan over TLS = %v, %q; want the plan", err, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"expired client certificate", append([]string{"cat", "--addr", addr}, clientArgs(pki, "expired")...), "refused our client certificate: expired"},
		{"client certificate of another CA", append([]string{"cat", "--addr", addr}, clientArgs(pki, "stranger")...), "signed by a CA the server does not trust"},
		{"another server name", append([]string{"cat", "--addr", "tls!localhost!" + port}, clientArgs(pki, "client")...), `is for another name: it names 127.0.0.1, not "localhost"`},
		{"no --ca", []string{"cat", "--addr", addr, "--cert", filepath.Join(pki, "client.crt"), "--key", filepath.Join(pki, "client.key")}, "needs --cert and --key (this client's certificate) and --ca"},
		{"--cert on plain TCP", append([]string{"cat", "--addr", "tcp!127.0.0.1!" + port}, clientArgs(pki, "client")...), "are for tls! addresses"},
		{"a missing key file", []string{"cat", "--addr", addr, "--cert", filepath.Join(pki, "client.crt"), "--key", filepath.Join(pki, "nothere.key"), "--ca", filepath.Join(pki, "ca.crt")}, "nothere.key"},
	} {
		out, err := shardfs(append(tc.args, "plan")...)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: shardfs cat = %v, %q; want an error containing %q", tc.name, err, out, tc.says)
		}
	}
}

// A write through a ,ro TLS listener is refused with EACCES, and the
// client says that the listener is read-only.
func TestClientTLSReadOnly(t *testing.T) {
	pki := testPKI(t)
	addr := serveDemoTLS(t, pki, ",ro")
	var out, errb strings.Builder
	err := run(context.Background(), append(append([]string{"write", "--addr", addr}, clientArgs(pki, "client")...), "0/ctl", "reset"), strings.NewReader(""), &out, &errb)
	if !errors.Is(err, linux.EACCES) || !strings.Contains(err.Error(), "is served with ,ro") {
		t.Errorf("shardfs write over a ,ro TLS listener = %v; want EACCES naming the read-only listener", err)
	}
	out.Reset()
	if err := run(context.Background(), append(append([]string{"cat", "--addr", addr}, clientArgs(pki, "client")...), "0/reconnects"), strings.NewReader(""), &out, &errb); err != nil || out.String() != "0\n" {
		t.Errorf("shardfs cat 0/reconnects after the refused reset = %v, %q; want 0", err, out.String())
	}
}

// serve refuses a tls! listener without its certificate flags, and names
// a file it cannot read, before discovery.
func TestServeTLSFlags(t *testing.T) {
	pki := testPKI(t)
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("TLS-FLAGS-TOKEN\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--flavor", "discord", "--total", "auto", "--api", "http://127.0.0.1:1", "--token-file", tok, "--listen", "tls!0.0.0.0!0"}
	for _, tc := range []struct {
		extra []string
		says  string
	}{
		{nil, "a tls listener needs --tls-cert, --tls-key and --tls-client-ca"},
		{[]string{"--tls-cert", filepath.Join(pki, "server.crt"), "--tls-key", filepath.Join(pki, "server.key")}, "needs --tls-cert, --tls-key and --tls-client-ca"},
		{[]string{"--tls-cert", filepath.Join(pki, "server.crt"), "--tls-key", filepath.Join(pki, "gone.key"), "--tls-client-ca", filepath.Join(pki, "ca.crt")}, "gone.key"},
		{[]string{"--tls-cert", filepath.Join(pki, "server.crt"), "--tls-key", filepath.Join(pki, "server.key"), "--tls-client-ca", filepath.Join(pki, "server.key")}, "no PEM certificate"},
	} {
		var out, errb strings.Builder
		err := run(context.Background(), append(base, tc.extra...), strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "discover") {
			t.Errorf("serve %v = %v; want an error containing %q", tc.extra, err, tc.says)
		}
	}
}

// shardfs mount's arguments: flags before or after ADDR DIR; each
// mistake named before anything is dialled.
func TestMountArgs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"tls!127.0.0.1!1"}, "mount needs ADDR and DIR"},
		{[]string{"tls!127.0.0.1!1", dir, "--access", "bob"}, `--access "bob"`},
		{[]string{"tls!127.0.0.1!1", file}, "is not a directory"},
		{[]string{"tls!127.0.0.1!1", dir, "--ro"}, "needs --cert and --key"},
		{[]string{"--ro", "tcp!127.0.0.1!1", dir, "--ca", file}, "are for tls! addresses"},
	} {
		var out, errb strings.Builder
		err := run(context.Background(), append([]string{"mount"}, tc.args...), strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("shardfs mount %q = %v; want an error containing %q", tc.args, err, tc.says)
		}
	}
}

// shardfs certs makes a CA, a server certificate and a client
// certificate that a tls! listener and the client accept; keys are 0600
// and never overwritten.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	shardfs := func(args ...string) (string, error) {
		var out, errb strings.Builder
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		return out.String() + errb.String(), err
	}
	for _, args := range [][]string{
		{"certs", "ca", "--dir", dir},
		{"certs", "server", "--dir", dir, "--name", "server", "--host", "127.0.0.1,node0.example"},
		{"certs", "client", "--dir", dir, "--name", "client", "--days", "7"},
	} {
		if out, err := shardfs(args...); err != nil {
			t.Fatalf("shardfs %q = %v\n%s", args, err, out)
		}
	}
	for _, f := range []string{"ca.key", "server.key", "client.key"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", f, fi, err)
		}
	}
	if out, err := shardfs("certs", "ca", "--dir", dir); err == nil || !strings.Contains(err.Error(), "ca.key") {
		t.Errorf("a second certs ca in the same folder = %v, %q; want a refusal naming ca.key", err, out)
	}
	if out, err := shardfs("certs", "client", "--dir", t.TempDir(), "--name", "x"); err == nil || !strings.Contains(err.Error(), "shardfs certs ca --dir") {
		t.Errorf("certs client without a CA = %v, %q; want it to say how to make one", err, out)
	}
	addr := serveDemoTLS(t, dir, "")
	if out, err := shardfs(append(append([]string{"cat", "--addr", addr}, clientArgs(dir, "client")...), "plan")...); err != nil || !strings.Contains(out, "flavor discord") {
		t.Errorf("cat plan with shardfs certs' certificates = %v, %q", err, out)
	}
}

// The shell examples reach a tls! listener through the built-in client
// (9p!tls!HOST!PORT) with the certificates in SHARDFS_CERT, SHARDFS_KEY
// and SHARDFS_CA; those variables do not get in the way of a tcp!
// address.
func TestExamplesOverTLS(t *testing.T) {
	pki := testPKI(t)
	addr := serveDemoTLS(t, pki, "")
	dir := binDir(t)
	env := []string{"SHARDFS_CERT=" + filepath.Join(pki, "client.crt"), "SHARDFS_KEY=" + filepath.Join(pki, "client.key"), "SHARDFS_CA=" + filepath.Join(pki, "ca.crt")}
	runExample(t, dir, env, "wait-ready.sh", "9p!"+addr, "60")
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	var out, errb strings.Builder
	err := run(context.Background(), []string{"cat", "--addr", "tcp!127.0.0.1!1", "plan"}, strings.NewReader(""), &out, &errb)
	if err == nil || strings.Contains(err.Error(), "tls!") {
		t.Errorf("cat over tcp! with SHARDFS_CERT set = %v; want a dial error, not a TLS one", err)
	}
}

// serve logs the TLS listeners' certificate, and warns when it is not
// valid now or expires within 30 days.
func TestLogTLSCert(t *testing.T) {
	pki := testPKI(t)
	tf := fsrv.TLSFiles{Cert: filepath.Join(pki, "server.crt"), Key: filepath.Join(pki, "server.key"), ClientCA: filepath.Join(pki, "ca.crt")}
	_, leaf, err := tf.Config([]string{"tls!127.0.0.1!0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		now  time.Time
		want string
	}{
		{time.Now(), `level=INFO msg="TLS listeners' certificate" cert=` + tf.Cert + " cn=server names=127.0.0.1"},
		{leaf.NotAfter.Add(-24 * time.Hour), "level=WARN msg=\"the TLS listeners' certificate expires within 30 days"},
		{leaf.NotAfter.Add(time.Hour), "level=WARN msg=\"the TLS listeners' certificate is not valid now"},
		{leaf.NotBefore.Add(-time.Hour), "or this machine's clock is wrong"},
	} {
		var b strings.Builder
		fsrv.LogCert(slog.New(slog.NewTextHandler(&b, nil)), tf.Cert, leaf, tc.now)
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("at %v: log %q; want %q", tc.now, b.String(), tc.want)
		}
	}
}

// serve with a tls! listener on every interface (no ,insecure needed)
// beside its unix socket: the built-in client reads and resets a shard
// over TLS with a certificate from the CA, and a client whose
// certificate is expired is refused, logged by serve with its name.
func TestServeTLS(t *testing.T) {
	const token = "TLS-SERVE-TOKEN-1"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 1, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	pki := testPKI(t)
	dir := binDir(t)
	sock := filepath.Join(t.TempDir(), "serve.sock")
	cmd := command(t, dir, "serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto",
		"--listen", "unix!"+sock, "--listen", "tls!0.0.0.0!0",
		"--tls-cert", filepath.Join(pki, "server.crt"), "--tls-key", filepath.Join(pki, "server.key"), "--tls-client-ca", filepath.Join(pki, "ca.crt"))
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("serve exited with %v:\n%s", err, stderr)
		}
		if strings.Contains(stderr.String(), token) {
			t.Errorf("serve's log holds the token")
		}
	}()
	var port string
	eventually(t, "serve listening on tls!", func() (bool, string) {
		s := stderr.String()
		// Every interface shows as :: on a dual-stack machine.
		if i := strings.Index(s, "addr=tls!"); i >= 0 {
			a := strings.Fields(s[i:])[0]
			port = a[strings.LastIndex(a, "!")+1:]
			return true, port
		}
		return false, s
	})
	if s := stderr.String(); !strings.Contains(s, "!"+port+" access=read-write") || !strings.Contains(s, "TLS listeners' certificate") {
		t.Errorf("serve's log does not describe the TLS listener and its certificate:\n%s", s)
	}
	addr := "tls!127.0.0.1!" + port
	shardfs := func(cert string, args ...string) (string, error) {
		c := command(t, dir, append(append([]string{args[0], "--addr", addr}, clientArgs(pki, cert)...), args[1:]...)...)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	eventually(t, "shard 0 READY over TLS", func() (bool, string) {
		out, err := shardfs("client", "cat", "0/state")
		return err == nil && out == "READY\n", out
	})
	if out, err := shardfs("client", "write", "0/ctl", "reset"); err != nil {
		t.Fatalf("reset over TLS: %v\n%s", err, out)
	}
	if out, err := shardfs("client", "cat", "0/reconnects"); err != nil || out != "1\n" {
		t.Errorf("0/reconnects after a reset over TLS = %q, %v; want 1", out, err)
	}
	out, err := shardfs("expired", "cat", "status")
	if err == nil || !strings.Contains(out, "refused our client certificate: expired") {
		t.Errorf("cat with an expired certificate = %v, %q; want a refusal that says expired", err, out)
	}
	eventually(t, "serve logging the refusal", func() (bool, string) {
		s := stderr.String()
		return strings.Count(s, `reason="client certificate expired"`) == 1 && strings.Contains(s, "CN=expired expired at"), s
	})
}

// Issue 21's roles test with a real signal: serve with --tls-deny; a
// client's serial written to the deny list and SIGHUP sent, a new
// connection with that certificate is refused and the one accepted
// before is closed, while the unix socket keeps serving.
func TestServeDenyOnSIGHUP(t *testing.T) {
	const token = "TLS-DENY-TOKEN-1"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 1, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	pki := testPKI(t)
	deny := filepath.Join(t.TempDir(), "deny")
	if err := os.WriteFile(deny, []byte("# nobody yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := binDir(t)
	sock := filepath.Join(t.TempDir(), "serve.sock")
	cmd := command(t, dir, "serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto",
		"--listen", "unix!"+sock, "--listen", "tls!127.0.0.1!0",
		"--tls-cert", filepath.Join(pki, "server.crt"), "--tls-key", filepath.Join(pki, "server.key"),
		"--tls-client-ca", filepath.Join(pki, "ca.crt"), "--tls-deny", deny)
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("serve exited with %v:\n%s", err, stderr)
		}
	}()
	var addr string
	eventually(t, "serve listening on tls!", func() (bool, string) {
		s := stderr.String()
		if i := strings.Index(s, "addr=tls!"); i >= 0 {
			addr = strings.Fields(s[i+len("addr="):])[0]
			return true, addr
		}
		return false, s
	})
	conf, err := fsrv.ClientTLSConfig(filepath.Join(pki, "client.crt"), filepath.Join(pki, "client.key"), filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := client.Dial(t.Context(), addr, client.WithTLS(conf))
	if err != nil {
		t.Fatalf("dial before the deny: %v", err)
	}
	defer accepted.Close()
	if _, err := accepted.ReadFile("status"); err != nil {
		t.Fatalf("read before the deny: %v", err)
	}

	pem, err := os.ReadFile(filepath.Join(pki, "client.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem2.Decode(pem)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(deny, []byte(fsrv.Serial(cert)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new connection with the denied certificate refused", func() (bool, string) {
		c, err := client.Dial(t.Context(), addr, client.WithTLS(conf))
		if err != nil {
			return true, err.Error()
		}
		_, err = c.ReadFile("status")
		c.Close()
		return err != nil, fmt.Sprint(err)
	})
	// The denied certificate's own session is cut off too (attack 21b,
	// finding 7: it kept writing ctl after the reload); the fsrv test
	// TestReloadDeny shows another certificate's connection kept.
	eventually(t, "the reload closing the denied certificate's connection", func() (bool, string) {
		s := stderr.String()
		return strings.Contains(s, "no longer allowed after the reload"), s
	})
	if _, err := accepted.ReadFile("status"); err == nil {
		t.Error("the connection accepted before the deny still reads after the reload; want it closed")
	}
	local, err := client.Dial(t.Context(), "unix!"+sock)
	if err != nil {
		t.Fatalf("dial the unix socket after the reload: %v", err)
	}
	defer local.Close()
	if got, err := local.ReadFile("status"); err != nil || len(got) == 0 {
		t.Errorf("the unix socket after the reload: %q, %v; want it served", got, err)
	}
	if cmd.ProcessState != nil {
		t.Fatal("serve exited on SIGHUP")
	}
}

// Attack report finding 11: a write refused because the file takes no
// writes, on a read-write listener, blames the file, not a read-only
// listener.
func TestClientReadOnlyFile(t *testing.T) {
	pki := testPKI(t)
	addr := serveDemoTLS(t, pki, "")
	var out, errb strings.Builder
	err := run(context.Background(), append(append([]string{"write", "--addr", addr}, clientArgs(pki, "client")...), "0/state", "READY"), strings.NewReader(""), &out, &errb)
	if !errors.Is(err, linux.EACCES) || !strings.Contains(err.Error(), "0/state is read-only: no listener takes writes to it") || strings.Contains(err.Error(), ",ro") {
		t.Errorf("shardfs write of 0/state over a read-write TLS listener = %v; want EACCES naming the read-only file", err)
	}
}
