package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/baremetal"
	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/core"
)

const nbCmdline = "shardfs.flavor=discord shardfs.total=2 shardfs.listen=tcp!0.0.0.0!5641,insecure"

func TestNetbootRefuses(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open-token")
	os.WriteFile(open, []byte("tok"), 0o644)
	empty := filepath.Join(dir, "empty-token")
	os.WriteFile(empty, nil, 0o600)
	keyFile := filepath.Join(dir, "ca-and-key.pem")
	ca, err := certs.NewCA("x", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := certs.KeyPEM(ca.Key)
	os.WriteFile(keyFile, append(certs.CertPEM(ca.Cert), kp...), 0o600)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad flavor", []string{"--cmdline", "shardfs.flavor=irc shardfs.total=2 shardfs.listen=unix!/s"}, "shardfs.flavor"},
		{"token on the command line", []string{"--cmdline", nbCmdline + " shardfs.token=SEKRIT"}, "shardfs.token"},
		{"no listener, no enrollment", []string{"--cmdline", "shardfs.flavor=discord shardfs.total=2"}, "shardfs.listen: missing"},
		{"tls listener, no enrollment", []string{"--cmdline", "shardfs.flavor=discord shardfs.total=2 shardfs.listen=tls!0.0.0.0!5641"}, "needs shardfs.enroll"},
		{"enrollment without its CA", []string{"--cmdline", nbCmdline + " shardfs.enroll=10.0.0.2:5650"}, "needs --enroll-ca"},
		{"enrollment CA without the server", []string{"--cmdline", nbCmdline, "--enroll-ca", open}, "needs shardfs.enroll"},
		{"malformed enrollment address", []string{"--cmdline", nbCmdline + " shardfs.enroll=10.0.0.2"}, "shardfs.enroll: malformed"},
		{"a key as the enrollment CA", []string{"--cmdline", nbCmdline + " shardfs.enroll=10.0.0.2:5650", "--enroll-ca", keyFile}, "no key"},
		{"token in the image", []string{"--cmdline", nbCmdline, "--token-file", empty}, "--token-file goes to the enrollment server"},
		{"etcd key in the image", []string{"--cmdline", nbCmdline, "--etcd-key", empty}, "--etcd-key goes to the enrollment server"},
		{"serve with image flags", []string{"--serve", "127.0.0.1:0", "--cmdline", nbCmdline}, "--cmdline makes an image"},
		{"no out", []string{"--cmdline", nbCmdline}, "--out is required"},
		{"modules without kernel", []string{"--cmdline", nbCmdline, "--modules", "e1000"}, "needs --kernel"},
		{"plain tcp beyond loopback", []string{"--cmdline", "shardfs.flavor=discord shardfs.total=2 shardfs.listen=tcp!0.0.0.0!5641"}, "shardfs.listen: malformed value: \"tcp!0.0.0.0!5641\": plain TCP beyond loopback"},
		{"etcd without bot", []string{"--cmdline", nbCmdline + " shardfs.etcd=http://10.0.0.1:2379"}, "shardfs.bot: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"netboot"}, tc.args...)
			if tc.name != "no out" && !strings.HasPrefix(tc.name, "serve") {
				args = append(args, "--out", dir, "--ca-bundle", "")
			}
			err := run(context.Background(), args, nil, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("netboot %q = %v; want an error containing %q", tc.args, err, tc.want)
			}
			if strings.Contains(err.Error()+stderr.String(), "SEKRIT") {
				t.Errorf("netboot's error shows the token: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, baremetal.InitrdFile)); err == nil {
				t.Errorf("netboot wrote an image despite the refusal")
			}
		})
	}
}

// staticELF writes the smallest file debug/elf reads as a static x86-64
// executable: an ELF header with no program header, so no PT_INTERP.
func staticELF(t *testing.T, name string) {
	t.Helper()
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[6] = 2, 1, 1                // 64-bit, little-endian, version 1
	binary.LittleEndian.PutUint16(h[16:], 2)  // ET_EXEC
	binary.LittleEndian.PutUint16(h[18:], 62) // EM_X86_64
	binary.LittleEndian.PutUint32(h[20:], 1)  // EV_CURRENT
	binary.LittleEndian.PutUint16(h[52:], 64) // e_ehsize
	if err := os.WriteFile(name, h, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := baremetal.CheckStatic(name); err != nil {
		t.Fatalf("the fake static binary: %v", err)
	}
}

func TestNetbootDryRun(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "enroll-ca.crt")
	ca, err := certs.NewCA("enrollment CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(caFile, certs.CertPEM(ca.Cert), 0o644)
	init := filepath.Join(dir, "shardfs-static")
	staticELF(t, init)
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"netboot", "--dry-run", "--init", init, "--out", filepath.Join(dir, "out"), "--ca-bundle", "", "--enroll-ca", caFile, "--cmdline", nbCmdline + " shardfs.enroll=10.0.0.2:5650 shardfs.colour=red"}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{"boot.ipxe", "initrd.cpio.gz", "file    0755 /init < " + init, "chardev 0600 /dev/console 5:1", "file    0644 /etc/shardfs/enroll-ca.crt < " + caFile, "mount devtmpfs /dev"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run =\n%s\nwant %q", out, want)
		}
	}
	if strings.Contains(out, "secrets") || strings.Contains(out, "tls.cpio.gz") {
		t.Errorf("dry run shows a secrets initrd:\n%s", out)
	}
	if !strings.Contains(stderr.String(), "shardfs.colour") {
		t.Errorf("stderr = %q; want a warning naming shardfs.colour", stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dry run created the output folder: %v", err)
	}

	// A dynamic binary (this test binary with cgo, or /bin/sh) is
	// refused, with how to build a static one.
	dyn := "/bin/sh"
	if self, _ := os.Executable(); baremetal.CheckStatic(self) != nil {
		dyn = self
	}
	err = run(context.Background(), []string{"netboot", "--dry-run", "--init", dyn, "--ca-bundle", "", "--cmdline", nbCmdline}, nil, io.Discard, io.Discard)
	if !errors.Is(err, baremetal.ErrNotStatic) || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("netboot with a dynamic /init = %v; want ErrNotStatic saying how to build", err)
	}
}

// TestNoTokenNode: a node that did not enroll shows every
// shard FATAL with "no token", at once (no identify pacing).
func TestNoTokenNode(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, tr, tree, err := newNoTokenNode(baremetal.Settings{Flavor: core.Discord, Total: "4", Shards: "1-3"}, log)
	if err != nil {
		t.Fatal(err)
	}
	if tree.Root() == nil {
		t.Fatal("no tree")
	}
	events := n.Events()
	n.Start()
	defer func() {
		n.Close()
		tr.wg.Wait()
	}()
	for {
		changed := events.Notify() // before the look, so no change is missed
		diags := n.Snapshot(nil)
		fatal := 0
		for _, d := range diags {
			if d.State == core.Fatal {
				fatal++
				if d.LastError == nil || !strings.Contains(d.LastError.Error(), "no token") {
					t.Fatalf("shard %d: FATAL with %v; want \"no token\"", d.Shard, d.LastError)
				}
			}
		}
		if len(diags) != 3 {
			t.Fatalf("%d shards; want 3 (1-3 of 4)", len(diags))
		}
		if fatal == len(diags) {
			return
		}
		<-changed
	}
}

// TestPXEFleetArgs: the serve flags a PXE node's command line becomes
// (baremetal.Settings.Args, with the etcd files enrollment brought)
// are flags serve's etcd configuration takes: the endpoints, the bot, the
// node's name and etcd's TLS.
func TestPXEFleetArgs(t *testing.T) {
	dir := t.TempDir()
	ca, err := certs.NewCA("etcd CA", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "etcd-ca.crt")
	if err := os.WriteFile(caFile, certs.CertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue(certs.Client, "node", nil, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(filepath.Join(dir, "etcd"), c.Cert, c.Key); err != nil {
		t.Fatal(err)
	}
	s, probs := baremetal.ParseCmdline("shardfs.flavor=discord shardfs.total=auto shardfs.listen=unix!/run/s shardfs.etcd=https://10.0.0.1:2379,https://10.0.0.2:2379 shardfs.bot=mybot")
	if len(probs) != 0 {
		t.Fatal(probs)
	}
	s.Node = baremetal.NodeName("", net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3})
	s.EtcdCA, s.EtcdCert, s.EtcdKey = caFile, filepath.Join(dir, "etcd.crt"), filepath.Join(dir, "etcd.key")

	// serve's own flags: those the test does not look at are taken as
	// strings.
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	var ef etcdFlags
	ef.register(fl)
	var tf tlsFlags
	tf.register(fl)
	for _, name := range []string{"flavor", "total", "shards", "api", "gateway", "listen"} {
		fl.String(name, "", "")
	}
	if err := fl.Parse(s.Args()); err != nil {
		t.Fatalf("serve's flags refuse %q: %v", s.Args(), err)
	}
	cfg, err := ef.config(false)
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil || strings.Join(cfg.Endpoints, " ") != "https://10.0.0.1:2379 https://10.0.0.2:2379" || cfg.Bot != "mybot" || cfg.Node != "pxe-52-54-00-01-02-03" {
		t.Fatalf("etcd configuration = %+v; want both endpoints, bot mybot, node pxe-52-54-00-01-02-03", cfg)
	}
	if cfg.TLS == nil || cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 1 {
		t.Errorf("etcd TLS = %+v; want the CA and the client certificate", cfg.TLS)
	}
}
