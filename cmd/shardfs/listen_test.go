package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hugelgupf/p9/linux"

	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// serve's defaults are DESIGN.md section 7.7's: read-write on the unix
// socket only, read-only on loopback TCP; demo keeps TCP read-write.
func TestDefaultListeners(t *testing.T) {
	sock := "unix!" + fsrv.DefaultSocket()
	for _, tc := range []struct {
		name string
		got  []string
		want []string
		ro   []bool
	}{
		{"serve", serveListeners(), []string{sock, "tcp!127.0.0.1!5640,ro"}, []bool{false, true}},
		{"demo", demoListeners(), []string{"tcp!127.0.0.1!5640", sock}, []bool{false, false}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s listens on %q by default; want %q", tc.name, tc.got, tc.want)
			continue
		}
		for i, a := range tc.got {
			la, err := fsrv.ParseListenAddr(a)
			if err != nil || la.ReadOnly != tc.ro[i] || la.Insecure {
				t.Errorf("%s: ParseListenAddr(%q) = %+v, %v; want ReadOnly %t", tc.name, a, la, err, tc.ro[i])
			}
		}
	}
}

// Plain TCP beyond loopback fails serve at start, before discovery, with
// an error that names the TLS listener to use instead.
func TestServeRefusesPlainTCPBeyondLoopback(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("PLAIN-TCP-TOKEN\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Discovery would fail on this API: an error from it would mean the
	// listener was checked too late.
	for _, tc := range []struct{ listen, want string }{
		{"tcp!0.0.0.0!5640", "use tls!0.0.0.0!5640"},
		{"tcp!*!5640", "use tls!*!5640"},
		{"0.0.0.0:5640", "use tls!0.0.0.0!5640"},
		{"tcp!127.0.0.1!0,frob", `unknown listener option "frob"`},
	} {
		var out, errb strings.Builder
		args := []string{"serve", "--flavor", "discord", "--total", "auto", "--api", "http://127.0.0.1:1", "--token-file", tok, "--listen", "unix!" + filepath.Join(t.TempDir(), "s.sock"), "--listen", tc.listen}
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "discovery") {
			t.Errorf("serve --listen %s = %v; want an error containing %q", tc.listen, err, tc.want)
		}
		if strings.HasPrefix(tc.want, "use tls") && (!errors.Is(err, fsrv.ErrInsecure) || !strings.Contains(err.Error(), ",insecure")) {
			t.Errorf("serve --listen %s = %v; want fsrv.ErrInsecure, naming ,insecure", tc.listen, err)
		}
	}
}

// A read-only TCP listener beside the read-write unix socket, as serve
// listens by default: reads work on both, writes only on the socket, and
// the built-in client says where to write instead.
func TestServeReadOnlyTCP(t *testing.T) {
	const token = "RO-TOKEN-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 1, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	dir := binDir(t)
	sock := filepath.Join(t.TempDir(), "serve.sock")
	cmd := command(t, dir, "serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto", "--listen", "unix!"+sock, "--listen", "tcp!127.0.0.1!0,ro")
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
	addr := tcpListener(t, stderr)
	if s := stderr.String(); !strings.Contains(s, "addr="+addr+" access=read-only") || !strings.Contains(s, "addr=unix!"+sock+" access=read-write") {
		t.Errorf("serve's log does not say which listener is read-only:\n%s", s)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the unix socket: %v, %v; want mode 0600", fi, err)
	}
	root := dotlRoot(t, tcpHostPort(addr))
	eventually(t, "shard 0 READY over the read-only listener", func() (bool, string) {
		s, err := dotlRead(root, "0/state")
		return err == nil && s == "READY\n", s
	})
	if err := write(root, "0/ctl", []byte("reset\n")); !errors.Is(err, linux.EACCES) {
		t.Errorf("reset over the read-only listener = %v; want EACCES", err)
	}
	for _, p := range []string{"dispatch", "0/dispatch", "0/send"} {
		if _, err := dotlRead(root, p); !errors.Is(err, linux.ENOENT) {
			t.Errorf("read %s over the read-only listener = %v; want ENOENT", p, err)
		}
	}
	out, err := command(t, dir, "write", "--addr", addr, "0/ctl", "reset").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "read-only listener") || !strings.Contains(string(out), "--addr unix!") {
		t.Errorf("shardfs write over the read-only listener = %v, %q; want a hint at the unix socket", err, out)
	}
	if r, _ := dotlRead(root, "0/reconnects"); r != "0\n" {
		t.Errorf("0/reconnects = %q after refused resets; want 0", r)
	}
	if out, err := command(t, dir, "write", "--addr", "unix!"+sock, "0/ctl", "reset").CombinedOutput(); err != nil {
		t.Fatalf("reset over the unix socket: %v\n%s", err, out)
	}
	if r, _ := dotlRead(root, "0/reconnects"); r != "1\n" {
		t.Errorf("0/reconnects = %q after a reset over the socket; want 1", r)
	}
	// A command from stdin without its newline is applied at clunk, and
	// its refusal still reaches the writer.
	stdinCmd := command(t, dir, "write", "--addr", "unix!"+sock, "0/ctl")
	stdinCmd.Stdin = strings.NewReader("frob")
	if out, err := stdinCmd.CombinedOutput(); err == nil || !strings.Contains(string(out), `event=rejected cmd=? len=4 err="unknown command; usage: `) {
		t.Errorf("shardfs write 0/ctl <<< frob (no newline) = %v, %q; want the refusal", err, out)
	}
}

// serve's default loopback TCP listener is optional: another local user
// may hold tcp!127.0.0.1!5640 before the node starts (the client refuses
// such a port), and serve then runs on its unix socket (node's
// TestRunOptionalListenerHeld). A listener given with --listen stays
// required (TestServeRefusesPlainTCPBeyondLoopback).
func TestServeDefaultTCPOptional(t *testing.T) {
	var f serveFlags
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	f.register(fl)
	if err := fl.Parse(nil); err != nil {
		t.Fatal(err)
	}
	listen, optional := f.listenAddrs()
	if want := serveListeners(); !slices.Equal(listen, want[:1]) || !slices.Equal(optional, want[1:]) {
		t.Errorf("serve's listeners = %q, optional %q; want %q, optional %q", listen, optional, want[:1], want[1:])
	}
	if err := fl.Parse([]string{"--listen", "tcp!127.0.0.1!0"}); err != nil {
		t.Fatal(err)
	}
	if listen, optional := f.listenAddrs(); !slices.Equal(listen, []string{"tcp!127.0.0.1!0"}) || optional != nil {
		t.Errorf("serve --listen tcp!127.0.0.1!0: listeners %q, optional %q; want it alone, required", listen, optional)
	}
}

// --tls-deny without a tls! listener is refused at start: nothing would
// read it, and the operator believes the certificates in it revoked.
func TestTLSDenyNeedsTLSListener(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	deny := filepath.Join(dir, "deny")
	for f, b := range map[string]string{tok: "DENY-TOKEN-1234\n", deny: "zz not a serial\n"} {
		if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range []string{"serve", "supervise"} {
		args := []string{cmd, "--flavor", "discord", "--total", "2", "--api", "http://127.0.0.1:1", "--token-file", tok,
			"--listen", "unix!" + filepath.Join(dir, cmd+".sock"), "--tls-deny", deny}
		if cmd == "supervise" {
			args = append(args, "--processes", "2")
		}
		var out, errb strings.Builder
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "--tls-deny") || !strings.Contains(err.Error(), "no tls! listener") {
			t.Errorf("%s --tls-deny without a tls! listener = %v; want a refusal naming --tls-deny", cmd, err)
		}
	}
}
