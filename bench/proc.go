package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childEnv names the role a re-executed harness binary plays. The harness
// starts every side of a comparison, and the simulator, as a process of its
// own, so that /proc/PID charges memory and CPU to the right side.
const childEnv = "SHARDFS_BENCH_CHILD"

// tokenEnv carries the simulator's bot token to the clients.
const tokenEnv = "SHARDFS_BENCH_TOKEN"

// benchToken is the token every simulator of the harness accepts.
const benchToken = "bench-token"

// child is a harness process playing one role. It reads one command a line
// on stdin and answers each with one line on stdout: "ok ..." or "err ...".
// Closing stdin ends it.
type child struct {
	role string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	info string // what followed "ready" on its first line

	mu     sync.Mutex // one call at a time
	stderr *tailBuffer
	done   chan struct{}
}

// self is the binary to re-execute: the harness itself, or the test binary
// in the smoke test.
func self() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}

// startChild starts the harness binary as role with args and waits for its
// "ready" line.
func startChild(role string, args ...string) (*child, error) {
	return startChildEnv(role, nil, args...)
}

// startChildEnv is startChild with env added to the child's environment.
func startChildEnv(role string, env []string, args ...string) (*child, error) {
	cmd := exec.Command(self(), args...)
	cmd.Env = append(append(os.Environ(), childEnv+"="+role, tokenEnv+"="+benchToken), env...)
	c := &child{role: role, cmd: cmd, stderr: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
	if verbose {
		cmd.Stderr = io.MultiWriter(c.stderr, prefixWriter{role, os.Stderr})
	} else {
		cmd.Stderr = c.stderr
	}
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = bufio.NewReaderSize(stdout, 1<<20)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", role, err)
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	line, err := c.readLine(2 * time.Minute)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("%s did not start: %w\n%s", role, err, c.stderr)
	}
	info, ok := strings.CutPrefix(line, "ready")
	if !ok {
		c.close()
		return nil, fmt.Errorf("%s: first line %q\n%s", role, line, c.stderr)
	}
	c.info = strings.TrimSpace(info)
	return c, nil
}

func (c *child) readLine(timeout time.Duration) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := c.out.ReadString('\n')
		ch <- result{strings.TrimRight(line, "\n"), err}
	}()
	select {
	case r := <-ch:
		return r.line, r.err
	case <-time.After(timeout):
		// The reader goroutine is left behind; the child is killed by the
		// caller's close, which ends it.
		return "", fmt.Errorf("no answer from %s within %v", c.role, timeout)
	}
}

// call sends one command and returns what followed "ok".
func (c *child) call(timeout time.Duration, format string, args ...any) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		return "", fmt.Errorf("%s %q: %w\n%s", c.role, cmd, err, c.stderr)
	}
	line, err := c.readLine(timeout)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w\n%s", c.role, cmd, err, c.stderr)
	}
	if rest, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("%s %q: %s", c.role, cmd, line)
}

// callInts is call for answers made of integers.
func (c *child) callInts(timeout time.Duration, format string, args ...any) ([]int64, error) {
	s, err := c.call(timeout, format, args...)
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: answer %q: %w", c.role, s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// close ends the child: stdin closes, and after a grace period it is killed
// by its process id.
func (c *child) close() {
	c.in.Close()
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// rss reads the resident set size of a process from /proc/PID/status.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat; it
// is 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// cpuTime reads a process's user plus system CPU time, all threads, from
// /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; fields restart after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state(3) ... utime is field 14, stime 15 (1-based over the
	// whole line), i.e. f[11] and f[12].
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(u+s) * clockTick, nil
}

// selfCPU is the harness's own CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tailBuffer keeps the last max bytes written to it: a child's stderr, shown
// when it fails.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// prefixWriter copies a child's stderr to ours, each line prefixed with its
// role.
type prefixWriter struct {
	role string
	w    io.Writer
}

func (p prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			fmt.Fprintf(p.w, "[%s] %s", p.role, line)
		}
	}
	return len(b), nil
}

// serveCommands is the child's side of the protocol: it announces ready
// with info, then runs one handler per line until stdin ends.
func serveCommands(info string, handlers map[string]func(args []string) (string, error)) {
	fmt.Printf("ready %s\n", info)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		h := handlers[f[0]]
		if h == nil {
			fmt.Printf("err unknown command %q\n", f[0])
			continue
		}
		out, err := h(f[1:])
		if err != nil {
			fmt.Printf("err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Printf("ok %s\n", out)
	}
}

// argInt reads the i-th argument of a command as an integer.
func argInt(args []string, i int) (int, error) {
	if i >= len(args) {
		return 0, fmt.Errorf("missing argument %d", i+1)
	}
	return strconv.Atoi(args[i])
}

func argDuration(args []string, i int) (time.Duration, error) {
	if i >= len(args) {
		return 0, fmt.Errorf("missing argument %d", i+1)
	}
	return time.ParseDuration(args[i])
}
