package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/gateway/gatewaysim/simctl"
)

// A newcomer's path: sim makes a token file and prints the serve command
// to run against it; that command, run as printed, brings the shards
// READY; a fault written to the simulator's ctl closes a shard, which
// resumes; a refused command says why. The token is printed nowhere.
func TestSimServeAndFault(t *testing.T) {
	tmp := t.TempDir()
	tokenFile := filepath.Join(tmp, "sim.token")
	ctlAddr := "unix!" + filepath.Join(tmp, "sim.sock")
	var stdout syncBuffer
	ready := make(chan *gatewaysim.Server, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- simctl.Run(ctx, simctl.Config{Listen: "127.0.0.1:0", TokenFile: tokenFile, Shards: 2, MaxConcurrency: 2,
			Ctl: ctlAddr, Stdout: &stdout, Ready: func(s *gatewaysim.Server, _ *simctl.Control) { ready <- s }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sim: %v", err)
		}
	}()
	var sim *gatewaysim.Server
	select {
	case sim = <-ready:
	case err := <-done:
		t.Fatalf("sim: %v", err)
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(tokenFile); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode = %v; want 0600", fi.Mode().Perm())
	}

	// The serve command sim printed, as printed, with a TCP listener to
	// read the tree on.
	var serveLine string
	for _, l := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "shardfs serve ") {
			serveLine = strings.TrimSpace(l)
		}
	}
	if serveLine == "" {
		t.Fatalf("sim printed no serve command:\n%s", stdout.String())
	}
	dir := binDir(t)
	args := append(strings.Fields(serveLine)[1:], "--listen", "tcp!127.0.0.1!0")
	cmd := command(t, dir, args...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	}()
	root := dotlRoot(t, tcpHostPort(tcpListener(t, &stderr)))
	eventually(t, "both shards READY", func() (bool, string) {
		s, err := dotlRead(root, "status")
		return err == nil && strings.Count(s, " READY ") == 2, s
	})

	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"write", "--addr", ctlAddr, "ctl", "close 0 4000"}, nil, &out, &errOut); err != nil {
		t.Fatalf("write ctl 'close 0 4000': %v\n%s", err, errOut.String())
	}
	eventually(t, "shard 0 resumed", func() (bool, string) {
		s, err := dotlRead(root, "0/events")
		return err == nil && strings.Contains(s, "event=resumed"), s
	})
	if st := sim.Stats(0); st.Resumes != 1 || st.Identifies != 1 {
		t.Errorf("shard 0 at the simulator: %d identifies, %d resumes; want 1, 1", st.Identifies, st.Resumes)
	}
	status, errOut := bytes.Buffer{}, bytes.Buffer{}
	if err := run(context.Background(), []string{"cat", "--addr", ctlAddr, "status"}, nil, &status, &errOut); err != nil {
		t.Fatalf("cat status: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(status.String(), "shard 0 sessions 1 live 1 identifies 1 resumes 1 ") {
		t.Errorf("sim's status after the fault:\n%s", status.String())
	}

	errOut.Reset()
	err = run(context.Background(), []string{"write", "--addr", ctlAddr, "ctl", "close 9x"}, nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), `event=rejected cmd="close 9x" err="\"9x\": want a shard number or all;`) {
		t.Errorf("write ctl 'close 9x' = %v; want the refusal's reason", err)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve: %v\n%s", err, stderr.String())
	}
	tok := strings.TrimSpace(string(token))
	for name, s := range map[string]string{"sim's stdout": stdout.String(), "serve's stderr": stderr.String()} {
		if strings.Contains(s, tok) {
			t.Errorf("the token appears in %s", name)
		}
	}
}

// A token file that exists is read, not replaced; an empty one is
// refused.
func TestSimTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	tok, made, err := simctl.TokenFrom(file)
	if err != nil || !made || tok == "" {
		t.Fatalf("TokenFrom(new file) = %q, %t, %v; want a made token", tok, made, err)
	}
	again, made, err := simctl.TokenFrom(file)
	if err != nil || made || again != tok {
		t.Errorf("TokenFrom(existing) = %q, %t, %v; want the same token, not made", again, made, err)
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := simctl.TokenFrom(file); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("TokenFrom(empty file) = %v; want a refusal", err)
	}
}
