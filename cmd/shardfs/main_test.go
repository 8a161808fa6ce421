package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"go.uber.org/goleak"

	sfclient "github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// The test binary doubles as the shardfs binary: with SHARDFS_TEST_MAIN set
// it runs main, so tests run the real command line without building it.
func TestMain(m *testing.M) {
	if os.Getenv("SHARDFS_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// binDir holds a "shardfs" link to the test binary, for scripts.
func binDir(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, "shardfs")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func command(t *testing.T, dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(dir, "shardfs"), args...)
	cmd.Env = append(os.Environ(), "SHARDFS_TEST_MAIN=1", "PATH="+dir+":"+os.Getenv("PATH"))
	return cmd
}

// demoProc is a running `shardfs demo`.
type demoProc struct {
	cmd      *exec.Cmd
	tcp      string // tcp!127.0.0.1!PORT
	hostPort string
	stderr   *syncBuffer
}

// syncBuffer collects a subprocess's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDemo runs `shardfs demo` on a free port and waits, at most 30 s, for
// it to say where it serves.
func startDemo(t *testing.T, dir string, args ...string) *demoProc {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "demo.sock")
	cmd := command(t, dir, append([]string{"demo", "--listen", "tcp!127.0.0.1!0", "--listen", "unix!" + sock}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &demoProc{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("shardfs demo exited with %v after SIGTERM; stderr:\n%s", err, d.stderr)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("shardfs demo did not stop within 30 s of SIGTERM")
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "serving 9P on tcp!"); ok {
				found <- "tcp!" + a
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case d.tcp = <-found:
	case <-time.After(30 * time.Second):
		t.Fatalf("shardfs demo never said where it serves; stderr:\n%s", d.stderr)
	}
	d.hostPort = tcpHostPort(d.tcp)
	return d
}

// tcpListener waits, at most 30 s, for serve to log its TCP listener and
// returns its address, tcp!HOST!PORT.
func tcpListener(t *testing.T, stderr *syncBuffer) string {
	t.Helper()
	var addr string
	eventually(t, "serve listening", func() (bool, string) {
		s := stderr.String()
		if i := strings.Index(s, "addr=tcp!"); i >= 0 {
			addr = strings.Fields(s[i+len("addr="):])[0]
			return true, addr
		}
		return false, s
	})
	return addr
}

// tcpHostPort turns tcp!HOST!PORT into HOST:PORT.
func tcpHostPort(addr string) string {
	parts := strings.Split(addr, "!")
	return net.JoinHostPort(parts[1], parts[2])
}

// eventually polls f, at a process boundary, for at most 30 s.
func eventually(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	// A bound on a hang only: on a loaded machine a supervised child took
	// 13 s from its start to serving its tree.
	err := poll.Until(t.Context(), what, 2*time.Minute, 100*time.Millisecond, func() error {
		if ok, last := f(); !ok {
			return fmt.Errorf("%q", last)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// dotlRoot is a 9P2000.L session with the tree at hostPort, through the
// client package, for the rest of the test.
func dotlRoot(t *testing.T, hostPort string) *sfclient.Client {
	t.Helper()
	conn, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sfclient.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dotlRead(root *sfclient.Client, path string) (string, error) {
	b, err := root.ReadFile(path)
	return string(b), err
}

// write writes text in one open; a refusal comes back with the node's
// reason (client.RefusedError), its errno kept.
func write(root *sfclient.Client, path string, text []byte) error {
	return root.WriteFile(path, text)
}

func plan9Fsys(t *testing.T, hostPort string) *client.Fsys {
	t.Helper()
	conn, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fsys, err := c.Attach(nil, "glenda", "")
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func plan9Read(fsys *client.Fsys, path string) (string, error) {
	f, err := fsys.Open(path, plan9.OREAD)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

// Clients no one here wrote read 0/state from a running `shardfs demo`;
// the two Go ones write reset to 0/ctl and see reconnects grow.
func TestForeignClientsAgainstDemo(t *testing.T) {
	dir := binDir(t)
	d := startDemo(t, dir, "--shards", "3")

	// hugelgupf/p9's client, used as a program that has the 9P library
	// alone would (not through shardfs's client package).
	root := hugelgupfRoot(t, d.hostPort)
	eventually(t, "0/state READY over 9P2000.L", func() (bool, string) {
		s, err := hugelgupfRead(root, "0/state")
		return err == nil && s == "READY\n", fmt.Sprint(s, err)
	})
	before, _ := hugelgupfRead(root, "0/reconnects")
	if err := hugelgupfWrite(root, "0/ctl", "reset\n"); err != nil {
		t.Fatalf("hugelgupf client: reset: %v", err)
	}
	after, _ := hugelgupfRead(root, "0/reconnects")
	if after == before {
		t.Fatalf("hugelgupf client: reconnects %q before and after reset", before)
	}

	fsys := plan9Fsys(t, d.hostPort)
	eventually(t, "0/state READY over 9P2000", func() (bool, string) {
		s, err := plan9Read(fsys, "0/state")
		return err == nil && s == "READY\n", fmt.Sprint(s, err)
	})
	before9, _ := plan9Read(fsys, "1/reconnects")
	f, err := fsys.Open("1/ctl", plan9.OWRITE|plan9.OTRUNC)
	if err != nil {
		t.Fatalf("9fans client: open 1/ctl: %v", err)
	}
	if _, err := f.Write([]byte("reset\n")); err != nil {
		t.Fatalf("9fans client: reset: %v", err)
	}
	f.Close()
	if after9, _ := plan9Read(fsys, "1/reconnects"); after9 == before9 {
		t.Fatalf("9fans client: reconnects %q before and after reset", before9)
	}
	f, _ = fsys.Open("1/ctl", plan9.OWRITE)
	_, err = f.Write([]byte("frobnicate\n"))
	f.Close()
	if err == nil || !strings.Contains(err.Error(), `invalid argument: "frobnicate": unknown command`) {
		t.Fatalf("9fans client: frobnicate = %v; want the reason", err)
	}

	for _, tool := range []string{"diodcat", "diodls"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (apt-get install diod)", tool)
			}
			t.Logf("%s not installed: skipping it (CI installs diod)", tool)
			continue
		}
	}
	if _, err := exec.LookPath("diodcat"); err == nil {
		out, err := exec.Command("diodcat", "-s", d.hostPort, "-a", "/", "0/state").CombinedOutput()
		if err != nil || string(out) != "READY\n" {
			t.Fatalf("diodcat 0/state = %q, %v; want READY", out, err)
		}
		out, err = exec.Command("diodls", "-s", d.hostPort, "-a", "/", "0").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "state\n") || !strings.Contains(string(out), "dispatch\n") {
			t.Fatalf("diodls 0 = %q, %v", out, err)
		}
	}
}

// exampleCmd runs the shell example script with args, env added to the
// test's environment and the binaries of dir first in PATH.
func exampleCmd(dir string, env []string, script string, args ...string) *exec.Cmd {
	examples, _ := filepath.Abs("../../examples/shell")
	cmd := exec.Command("sh", append([]string{filepath.Join(examples, script)}, args...)...)
	cmd.Env = append(os.Environ(), append(env, "SHARDFS_TEST_MAIN=1", "PATH="+dir+":"+os.Getenv("PATH"))...)
	return cmd
}

// runExample runs exampleCmd and returns its output; a failure fails the
// test.
func runExample(t *testing.T, dir string, env []string, script string, args ...string) string {
	t.Helper()
	out, err := exampleCmd(dir, env, script, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", script, args, err, out)
	}
	return string(out)
}

// The shell examples run against the demo stack through the built-in
// client (the QEMU integration tests run them on a real mount). The node
// runs in the test process, so that a shard can be held in BACKOFF for
// reset-stuck.sh: its backoff is an hour.
func TestExamplesAgainstDemo(t *testing.T) {
	dir := binDir(t)
	d, err := demo.Start(context.Background(), demo.Config{Shards: 2, Traffic: 20, Backoff: core.Fixed(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl, err := fsrv.Listen("tcp!127.0.0.1!0,ro")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, l, rl) }()
	defer func() {
		cancel()
		<-served
		d.Close()
	}()
	tree := "9p!" + fsrv.AddrString(l)
	run := func(env []string, script string, args ...string) string {
		t.Helper()
		return runExample(t, dir, env, script, args...)
	}
	run(nil, "wait-ready.sh", tree, "60")
	// Read-only, as serve's TCP listener is: scripts that read work, a
	// script that writes fails and says why.
	roTree := "9p!" + fsrv.AddrString(rl)
	run(nil, "wait-ready.sh", roTree, "60")
	if out, err := exampleCmd(dir, []string{"ROUNDS=1"}, "keep-lease.sh", roTree, "30s", "1", "true").CombinedOutput(); err == nil || !strings.Contains(string(out), "read-only listener") {
		t.Errorf("keep-lease.sh on a read-only listener = %v, %q; want a failure that names the read-only listener", err, out)
	}
	if out := run(nil, "watch-states.sh", tree, "0.2", "2"); strings.Count(out, "none -> READY") != 2 {
		t.Errorf("watch-states printed %q; want both shards going READY", out)
	}
	run([]string{"ROUNDS=1"}, "keep-lease.sh", tree, "30s", "1", "true")
	if d, _ := d.Node.Scheduler.Diag(1); d.Lease.Deadline.IsZero() {
		t.Errorf("after keep-lease.sh shard 1 has no lease")
	}
	run([]string{"ROUNDS=1"}, "keep-lease.sh", tree, "30s", "1", "false")
	waitDemo(t, d, "dispatch traffic", func() bool { return d.Tree.NodeDispatchLog().Size() > 3000 })
	if out := run(nil, "last-dispatch-types.sh", tree, "3"); out != "MESSAGE_CREATE\nMESSAGE_CREATE\nMESSAGE_CREATE\n" {
		t.Errorf("last-dispatch-types printed %q; want 3 MESSAGE_CREATE", out)
	}
	if out := run(nil, "reset-stuck.sh", tree, "0"); out != "" {
		t.Errorf("reset-stuck with every shard READY reset %q", out)
	}
	d.Sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	waitDemo(t, d, "shard 1 in BACKOFF", func() bool {
		diag, _ := d.Node.Scheduler.Diag(1)
		return diag.State == core.Backoff
	})
	if out := run(nil, "reset-stuck.sh", tree, "0"); out != "1\n" {
		t.Errorf("reset-stuck with shard 1 in BACKOFF printed %q; want 1", out)
	}
	run(nil, "wait-ready.sh", tree, "60")
	// The drop is one reconnect and reset-stuck's reset of the BACKOFF
	// shard another (a reset always counts), then one resume.
	if diag, _ := d.Node.Scheduler.Diag(1); diag.Reconnects != 2 || diag.Resumes != 1 {
		t.Errorf("shard 1 came back with %d reconnects and %d resumes; want 2 and 1", diag.Reconnects, diag.Resumes)
	}
}

// waitDemo waits for cond on an in-process demo, looking again at every
// lifecycle event and dispatch, for at most 30 s.
func waitDemo(t *testing.T, d *demo.Demo, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// serve refuses to start without a token, and takes none from a flag.
func TestServeToken(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--flavor", "discord", "--total", "1"}, "no token"},
		{[]string{"serve", "--flavor", "discord", "--total", "1", "--token", "abc"}, "flag provided but not defined: -token"},
		{[]string{"serve", "--flavor", "slack", "--total", "1"}, `unknown flavor "slack"`},
		{[]string{"serve", "--flavor", "discord", "--total", "0"}, `--total "0"`},
		{[]string{"serve", "--flavor", "discord", "--total", "4", "--shards", "3-5"}, "shard 4 is outside 0..3"},
		{[]string{"demo", "--shards", "0"}, "--shards 0"},
		{[]string{"demo", "--chaos", "1ns"}, "--chaos 1ns"},
		{[]string{"serve", "--flavor", "discord", "--total", "2000000000"}, `--total "2000000000"`},
		{[]string{"serve", "--flavor", "discord", "--total", "8", "--shards", "1,1"}, "shard 1 is named twice"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"cat"}, "cat needs a PATH"},
	} {
		var out, errb strings.Builder
		err := run(context.Background(), tc.args, strings.NewReader(""), &out, &errb)
		os.Unsetenv("SHARDFS_TOKEN")
		if err == nil || !strings.Contains(err.Error()+errb.String(), tc.want) {
			t.Errorf("shardfs %v = %v (stderr %q); want an error containing %q", tc.args, err, errb.String(), tc.want)
		}
	}
}

// serve against a gateway (the simulator in the test process): the shards
// come READY, the token never shows on stderr, and SIGTERM stops it
// cleanly.
func TestServeAgainstGateway(t *testing.T) {
	const token = "SERVE-TOKEN-do-not-print-1234"
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	dir := binDir(t)
	cmd := command(t, dir, "serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto", "--listen", "tcp!127.0.0.1!0", "--intents", "513")
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	root := dotlRoot(t, tcpHostPort(tcpListener(t, &stderr)))
	eventually(t, "both shards READY", func() (bool, string) {
		s, err := dotlRead(root, "status")
		return err == nil && strings.Count(s, " READY ") == 2, s
	})
	if plan, _ := dotlRead(root, "plan"); !strings.Contains(plan, "total 2\n") || !strings.Contains(plan, "max_concurrency 2\n") {
		t.Errorf("plan = %q; want the discovered total and max_concurrency", plan)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), token) {
		t.Fatalf("the token appeared on stderr:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "startup done") {
		t.Errorf("serve in a pipe logged no startup progress:\n%s", stderr.String())
	}
}

// startServe runs `serve` against sim with env added and waits, at most
// 30 s, for it to log its TCP listener; it returns the 9P2000.L root there.
func startServe(t *testing.T, dir string, sim *gatewaysim.Server, env []string, args ...string) (*exec.Cmd, *syncBuffer, *sfclient.Client) {
	t.Helper()
	cmd := command(t, dir, append([]string{"serve", "--flavor", "discord", "--api", sim.APIURL(), "--total", "auto", "--listen", "tcp!127.0.0.1!0"}, args...)...)
	cmd.Env = append(cmd.Env, env...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, stderr, dotlRoot(t, tcpHostPort(tcpListener(t, stderr)))
}

// A token from SHARDFS_TOKEN reaches the gateway (the shards come READY)
// but is gone from /proc/PID/environ of the serving process, which is
// still the process that was started: SIGTERM reaches it and its exit
// status comes back.
func TestServeTokenLeavesEnviron(t *testing.T) {
	const token = "ENVIRON-TOKEN-must-vanish-5678"
	dir := binDir(t)
	for _, how := range []string{"env", "file"} {
		t.Run(how, func(t *testing.T) {
			// A simulator each: one bucket identifies once in 5 s.
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: 2, MaxConcurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			var env, args []string
			if how == "env" {
				env = []string{"SHARDFS_TOKEN=" + token}
			} else {
				f := filepath.Join(t.TempDir(), "token")
				if err := os.WriteFile(f, []byte(token+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = []string{"--token-file", f}
			}
			cmd, stderr, root := startServe(t, dir, sim, env, args...)
			eventually(t, "both shards READY", func() (bool, string) {
				s, err := dotlRead(root, "status")
				return err == nil && strings.Count(s, " READY ") == 2, s
			})
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range strings.Split(string(environ), "\x00") {
				if strings.Contains(kv, token) || strings.HasPrefix(kv, "SHARDFS_TOKEN=") {
					t.Errorf("/proc/%d/environ of serve holds %q", cmd.Process.Pid, kv)
				}
			}
			cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, stderr)
			}
			if !strings.Contains(stderr.String(), "shutting down") {
				t.Errorf("serve did not shut down cleanly on SIGTERM:\n%s", stderr)
			}
		})
	}
}

// A serve that fails after the re-exec still reports its failure as its
// exit status.
func TestServeReexecExitStatus(t *testing.T) {
	cmd := command(t, binDir(t), "serve", "--flavor", "discord", "--gateway", "ws://127.0.0.1:1/", "--total", "1", "--listen", "unix!"+filepath.Join(t.TempDir(), "no", "such", "dir", "s.sock"))
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN=EXIT-TOKEN-1234")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("serve with an unusable listener = %v; want exit status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "shardfs: listen unix!") || strings.Contains(string(out), "EXIT-TOKEN") {
		t.Errorf("serve said %q; want the listen error and no token", out)
	}
}
