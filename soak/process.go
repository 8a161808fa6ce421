package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// Process is one `shardfs serve --etcd` child process and a 9P connection to
// its tree.
type Process struct {
	Name string

	bin  string
	args []string
	env  []string
	log  io.Writer

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *tail
	addr   string // 9P host:port
	client *p9.Client
	root   p9.File
	conn   net.Conn
}

// Start runs serve and waits, at most ReadyTimeout, for its 9P listener.
func (n *Process) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runningLocked() {
		return fmt.Errorf("%s: already running", n.Name)
	}
	cmd := exec.Command(n.bin, n.args...)
	cmd.Env = append(os.Environ(), n.env...)
	st := &tail{max: 1 << 20}
	cmd.Stderr = st
	if n.log != nil {
		cmd.Stderr = io.MultiWriter(st, prefixed{n.Name, n.log})
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	n.cmd, n.done, n.stderr = cmd, done, st
	addr, err := waitListener(ctx, st, done)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s: %w\n%s", n.Name, err, st)
	}
	n.addr = addr
	return n.connectLocked()
}

// opTimeout bounds one 9P operation: a node just woken from SIGSTOP may be
// slow, and one that is paused never answers.
const opTimeout = 5 * time.Second

func (n *Process) connectLocked() error {
	conn, err := net.DialTimeout("tcp", n.addr, opTimeout)
	if err != nil {
		return fmt.Errorf("%s: 9P: %w", n.Name, err)
	}
	_ = conn.SetDeadline(time.Now().Add(opTimeout))
	cl, err := p9.NewClient(conn)
	if err != nil {
		conn.Close()
		return fmt.Errorf("%s: 9P: %w", n.Name, err)
	}
	root, err := cl.Attach("")
	if err != nil {
		cl.Close()
		return fmt.Errorf("%s: 9P attach: %w", n.Name, err)
	}
	n.client, n.root, n.conn = cl, root, conn
	return nil
}

// rootFor returns the attached root with a fresh deadline on the
// connection, reconnecting after a failed operation.
func (n *Process) rootFor() (p9.File, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return nil, fmt.Errorf("%s: not running", n.Name)
	}
	if n.client == nil {
		if err := n.connectLocked(); err != nil {
			return nil, err
		}
	}
	_ = n.conn.SetDeadline(time.Now().Add(opTimeout))
	return n.root, nil
}

// failed drops the connection after an operation failed, so that the next
// one starts afresh.
func (n *Process) failed() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closeClientLocked()
}

// waitListener polls serve's log for its TCP listener, addr=tcp!HOST!PORT.
func waitListener(ctx context.Context, st *tail, done <-chan struct{}) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	for {
		s := st.String()
		if i := strings.Index(s, "addr=tcp!"); i >= 0 {
			parts := strings.Split(strings.Fields(s[i+len("addr="):])[0], "!")
			if len(parts) == 3 {
				return net.JoinHostPort(parts[1], parts[2]), nil
			}
		}
		select {
		case <-done:
			return "", errors.New("serve exited before listening")
		case <-ctx.Done():
			return "", fmt.Errorf("no 9P listener within %v", ReadyTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (n *Process) runningLocked() bool {
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Running reports whether the process is alive (a paused one is).
func (n *Process) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runningLocked()
}

// Pid is the process id of the current run, 0 when none runs.
func (n *Process) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return 0
	}
	return n.cmd.Process.Pid
}

// Signal sends sig to the running process.
func (n *Process) Signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return fmt.Errorf("%s: not running", n.Name)
	}
	return n.cmd.Process.Signal(sig)
}

// Stop sends sig and waits, at most d, for the process to end; then it
// kills it. It reports an exit other than 0 after SIGTERM or SIGINT.
func (n *Process) Stop(sig syscall.Signal, d time.Duration) error {
	n.mu.Lock()
	cmd, done, running := n.cmd, n.done, n.runningLocked()
	n.closeClientLocked()
	n.mu.Unlock()
	if !running {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s: still running %v after %v; killed", n.Name, d, sig)
	}
	if sig != syscall.SIGKILL && !cmd.ProcessState.Success() {
		return fmt.Errorf("%s: exit %v after %v", n.Name, cmd.ProcessState, sig)
	}
	return nil
}

func (n *Process) closeClientLocked() {
	if n.client != nil {
		n.client.Close()
		n.client, n.root, n.conn = nil, nil, nil
	}
}

// Log is what the current run has written to stderr (its last MiB).
func (n *Process) Log() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stderr == nil {
		return ""
	}
	return n.stderr.String()
}

// Read reads a file of the node's tree whole.
func (n *Process) Read(path string) (string, error) {
	s, err := n.read(path)
	if err != nil {
		n.failed()
	}
	return s, err
}

// ReadFrom reads a log file of the node's tree (dispatch, events) from the
// absolute offset off to its end, and returns where that end was.
func (n *Process) ReadFrom(path string, off int64) (string, int64, error) {
	s, end, err := n.readFrom(path, off)
	if err != nil {
		n.failed()
	}
	return s, end, err
}

// Size is the size of a file of the node's tree; a log file's is its end
// offset.
func (n *Process) Size(path string) (int64, error) {
	root, err := n.rootFor()
	if err != nil {
		return 0, err
	}
	_, f, err := root.Walk(split(path))
	if err != nil {
		n.failed()
		return 0, fmt.Errorf("%s: %s: %w", n.Name, path, err)
	}
	defer f.Close()
	_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
	if err != nil {
		n.failed()
		return 0, fmt.Errorf("%s: stat %s: %w", n.Name, path, err)
	}
	return int64(attr.Size), nil
}

func (n *Process) read(path string) (string, error) {
	s, _, err := n.readFrom(path, 0)
	return s, err
}

func (n *Process) readFrom(path string, off int64) (string, int64, error) {
	root, err := n.rootFor()
	if err != nil {
		return "", off, err
	}
	_, f, err := root.Walk(split(path))
	if err != nil {
		return "", off, fmt.Errorf("%s: %s: %w", n.Name, path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return "", off, fmt.Errorf("%s: open %s: %w", n.Name, path, err)
	}
	var b strings.Builder
	buf := make([]byte, 64<<10)
	for {
		k, err := f.ReadAt(buf, off)
		b.Write(buf[:k])
		off += int64(k)
		if err == io.EOF || k == 0 && err == nil {
			return b.String(), off, nil
		}
		if err != nil {
			return b.String(), off, fmt.Errorf("%s: read %s: %w", n.Name, path, err)
		}
	}
}

// Write writes text to a file of the node's tree (a ctl file).
func (n *Process) Write(path, text string) error {
	err := n.write(path, text)
	if err != nil {
		n.failed()
	}
	return err
}

func (n *Process) write(path, text string) error {
	root, err := n.rootFor()
	if err != nil {
		return err
	}
	_, f, err := root.Walk(split(path))
	if err != nil {
		return fmt.Errorf("%s: %s: %w", n.Name, path, err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		return fmt.Errorf("%s: open %s: %w", n.Name, path, err)
	}
	if _, err := f.WriteAt([]byte(text), 0); err != nil {
		return fmt.Errorf("%s: write %q to %s: %w", n.Name, text, path, err)
	}
	return nil
}

func split(path string) []string {
	var out []string
	for _, s := range strings.Split(path, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// prefixed writes each line with a name before it.
type prefixed struct {
	name string
	w    io.Writer
}

func (p prefixed) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			fmt.Fprintf(p.w, "%s: %s", p.name, line)
		}
	}
	return len(b), nil
}
