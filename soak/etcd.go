package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// EtcdEnv, in a process's environment, makes MaybeRunEtcd turn that process
// into an etcd server: DIR|CLIENT|PEER (a data folder and two host:port).
// The soak re-executes its own binary (the test binary, or bench's) with it,
// so that etcd is a child process it can kill, pause and restart without a
// second binary to build, and without etcd in the product binary.
const EtcdEnv = "SHARDFS_SOAK_ETCD"

// MaybeRunEtcd runs an etcd server and exits when EtcdEnv is set; it
// returns at once otherwise. Call it first thing in TestMain or main.
func MaybeRunEtcd() {
	spec, ok := os.LookupEnv(EtcdEnv)
	if !ok {
		return
	}
	if err := runEtcd(spec); err != nil {
		fmt.Fprintln(os.Stderr, "soak etcd:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runEtcd serves until SIGTERM or SIGINT; it prints "ready" on stdout once
// etcd accepts requests.
func runEtcd(spec string) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 && len(parts) != 6 {
		return fmt.Errorf("%s=%q: want DIR|CLIENT|PEER or DIR|CLIENT|PEER|NAME|ADVERTISED-PEER|INITIAL-CLUSTER", EtcdEnv, spec)
	}
	cfg := etcdtest.Config("soak", parts[0], parts[1], parts[2])
	if len(parts) == 6 {
		// A member of a cluster: it listens on its own peer port and
		// advertises its proxy's (see Cluster), so that the soak can cut
		// it off from the other members.
		cfg = etcdtest.Config(parts[3], parts[0], parts[1], parts[2])
		cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: parts[4]}}
		cfg.InitialCluster = parts[5]
		cfg.InitialClusterToken = "soak"
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("failed before ready: %w", err)
	case <-time.After(ReadyTimeout):
		return fmt.Errorf("not ready within %v", ReadyTimeout)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		return nil
	case err := <-e.Err():
		return err
	}
}

// ReadyTimeout bounds every wait for a child process (etcd, serve) to come
// up: a cold start on a loaded 2-core machine takes a few seconds.
const ReadyTimeout = 30 * time.Second

// Etcd is an etcd server running as a child process on fixed ports and a
// fixed data folder, so that it can be killed and started again as the same
// member with the same data.
type Etcd struct {
	// Endpoint is the client URL, http://127.0.0.1:PORT.
	Endpoint string

	exe          string
	dir          string
	client, peer string
	// A member of a Cluster: its name, the address it advertises to the
	// other members (its peer proxy) and the initial cluster.
	name, advPeer, cluster string
	stderr                 *tail

	// mu guards cmd and done, which Start replaces while a Cluster's
	// proxies ask for the member's pid.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// NewEtcd prepares an etcd server that exe (a binary calling MaybeRunEtcd)
// runs with its data in dir; Start starts it.
func NewEtcd(exe, dir string) (*Etcd, error) {
	client, err := freeAddr()
	if err != nil {
		return nil, err
	}
	peer, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &Etcd{Endpoint: "http://" + client, exe: exe, dir: dir, client: client, peer: peer}, nil
}

// Start runs the server and waits, at most ReadyTimeout, until it serves.
func (e *Etcd) Start(ctx context.Context) error {
	if e.Running() {
		return errors.New("etcd: already running")
	}
	cmd := exec.Command(e.exe)
	spec := e.dir + "|" + e.client + "|" + e.peer
	if e.name != "" {
		spec += "|" + e.name + "|" + e.advPeer + "|" + e.cluster
	}
	cmd.Env = append(os.Environ(), EtcdEnv+"="+spec)
	e.stderr = &tail{max: 16 << 10}
	cmd.Stderr = e.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	done := make(chan struct{})
	e.mu.Lock()
	e.cmd, e.done = cmd, done
	e.mu.Unlock()
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
		_ = cmd.Wait()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	select {
	case ok := <-ready:
		if ok {
			return nil
		}
		<-done
		return fmt.Errorf("etcd exited before ready: %s", e.stderr)
	case <-ctx.Done():
		e.Kill()
		return fmt.Errorf("etcd not ready within %v: %s", ReadyTimeout, e.stderr)
	}
}

// Running reports whether the process is alive (paused counts as alive).
func (e *Etcd) Running() bool {
	_, done := e.proc()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (e *Etcd) Kill() {
	if !e.Running() {
		return
	}
	cmd, done := e.proc()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// proc returns the process and the channel closed when it ends.
func (e *Etcd) proc() (*exec.Cmd, chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmd, e.done
}

// Signal sends sig (SIGSTOP, SIGCONT) to the running process.
func (e *Etcd) Signal(sig syscall.Signal) error {
	if !e.Running() {
		return errors.New("etcd: not running")
	}
	cmd, _ := e.proc()
	return cmd.Process.Signal(sig)
}

// Pid is the running process's id, 0 when it is not running.
func (e *Etcd) Pid() int {
	if !e.Running() {
		return 0
	}
	cmd, _ := e.proc()
	return cmd.Process.Pid
}

// StartEtcd starts an etcd member as a child process of this test binary
// (whose TestMain calls MaybeRunEtcd) on a folder of t's, killed when t
// ends, and a client of it, closed then: for a test that kills and
// restarts etcd (Etcd.Kill, Etcd.Start).
func StartEtcd(t testing.TB) (*Etcd, *clientv3.Client) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEtcd(exe, filepath.Join(t.TempDir(), "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Kill)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}
