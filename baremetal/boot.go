package baremetal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/clock"
)

// Where enrollment leaves the bot token, etcd's TLS files and the TLS
// listener's files (the keys and the token mode 0600, in a folder of mode
// 0700, in memory).
const (
	TokenPath       = "/secrets/token"
	EtcdCAPath      = "/secrets/etcd-ca.crt"
	EtcdCertPath    = "/secrets/etcd.crt"
	EtcdKeyPath     = "/secrets/etcd.key"
	TLSCertPath     = "/secrets/tls.crt"
	TLSKeyPath      = "/secrets/tls.key"
	TLSClientCAPath = "/secrets/client-ca.crt"
)

// Config is what Boot needs besides the machine itself.
type Config struct {
	// Console receives the progress lines (PID 1's standard error is the
	// kernel console).
	Console io.Writer
	// Run runs the node until ctx ends. token is empty when the node
	// did not enroll (no shardfs.enroll): Run must then still serve the
	// tree, every shard FATAL with "no token". An error is printed and Run
	// is called again after a backoff.
	Run func(ctx context.Context, s Settings, token string) error
	// Input is the console's input (PID 1's standard input), where an
	// operator types a node's one-time enrollment code; nil: none.
	Input io.Reader
	// Clock paces the retries; nil means real time.
	Clock clock.Clock
}

// Backoff between retries of DHCP and of the node: doubling from
// RetryMin to RetryMax; a node that ran RetryReset gets RetryMin again.
const (
	RetryMin   = 1 * time.Second
	RetryMax   = 30 * time.Second
	RetryReset = 5 * time.Minute
)

// Boot is PID 1: it sets up the machine (mounts, clock, modules, network),
// then runs the node, forever. It returns only when ctx ends; it never
// gives up, since PID 1 exiting panics the kernel.
func Boot(ctx context.Context, cfg Config) error {
	con := &console{w: cfg.Console}
	clk := clock.Or(cfg.Clock)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		reapLoop(ctx, func(pid int, ws unix.WaitStatus) {
			con.printf("reaped orphan %d (exit status %d)", pid, ws.ExitStatus())
		})
	})

	con.printf("setting up the root file system:\n%s", strings.TrimRight(RootFS.String(), "\n"))
	if err := RootFS.Apply(""); err != nil {
		con.printf("mounts: %v (going on)", err)
	}
	checkClock(con, clk)
	waitEntropy(con, clk)

	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		con.printf("reading /proc/cmdline: %v", err)
	}
	settings, probs := ParseCmdline(string(cmdline))
	refused := false
	for _, p := range probs {
		con.printf("kernel command line: %s", p)
		refused = refused || p.Fatal
	}

	if err := LoadModules("", func(name string, err error) {
		if err != nil {
			con.printf("module %s: %v", name, err)
		} else {
			con.printf("module %s loaded", name)
		}
	}); err != nil {
		con.printf("modules: %v", err)
	}
	if err := loUp(); err != nil {
		con.printf("loopback: %v", err)
	}
	var lease dhclient.Lease
	if err := retry(ctx, clk, con, "DHCP", func() error {
		var err error
		lease, err = dhcp(ctx, 10*time.Second)
		if err == nil {
			con.printf("network up: %v", lease)
		}
		return err
	}); err != nil {
		return err
	}

	if settings.Enroll != "" && !refused {
		name := settings.Node
		if name == "" {
			name = NodeName(leaseHostname(lease), leaseMAC(lease))
		}
		var addrs []string
		if ip := leaseIP(lease); ip != "" {
			addrs = append(addrs, ip)
		}
		if f, ok := cfg.Input.(*os.File); ok {
			hideTyping(f)
		}
		e, err := enrollNode(ctx, clk, con, "", settings, name, leaseMAC(lease), addrs, consoleLines(ctx, cfg.Input))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			con.printf("%v", err)
			return refuse(ctx, clk, con)
		}
		settings.Enrollment = &e
	}
	return runNode(ctx, clk, con, cfg.Run, "", settings, refused, leaseHostname(lease), leaseMAC(lease))
}

// runNode is Boot once the network is up and the node enrolled: it reads
// the files enrollment left under root, then refuses the node (refused, or no
// listener would export the tree) or runs it, retrying it with a backoff.
func runNode(ctx context.Context, clk clock.Clock, con *console, run func(context.Context, Settings, string) error, root string, settings Settings, refused bool, dhcpHostname string, mac net.HardwareAddr) error {
	token := readToken(con, root)
	refused = !checkListen(con, root, &settings) || refused
	if len(settings.Etcd) > 0 {
		etcdFiles(con, root, &settings)
		if settings.Node == "" {
			settings.Node = NodeName(dhcpHostname, mac)
			con.printf("etcd: this node is %q (no shardfs.node: the DHCP host name, or the NIC's address)", settings.Node)
		}
	}
	if refused {
		return refuse(ctx, clk, con)
	}
	return retry(ctx, clk, con, "the node", func() error {
		if token == "" {
			con.printf("starting the node without a token: its tree only, every shard FATAL, no etcd")
		} else {
			con.printf("starting the node: shardfs serve %s", strings.Join(settings.Args(), " "))
		}
		err := run(ctx, settings, token)
		if err == nil && ctx.Err() == nil {
			err = errors.New("the node stopped")
		}
		return err
	})
}

// checkListen completes the listeners with the TLS files enrollment
// brought: with them and no shardfs.listen, the node listens on
// DefaultListen; a tls! listener without them, or no listener at all, is
// refused.
func checkListen(con *console, root string, s *Settings) bool {
	have := 0
	for _, p := range []string{TLSCertPath, TLSKeyPath, TLSClientCAPath} {
		if _, err := os.Stat(root + p); err == nil {
			have++
		}
	}
	switch have {
	case 3:
		s.TLSCert, s.TLSKey, s.TLSClientCA = root+TLSCertPath, root+TLSKeyPath, root+TLSClientCAPath
		if len(s.Listen) == 0 {
			s.Listen = []string{DefaultListen}
			con.printf("listening on %s (the default: enrollment brought the TLS files)", DefaultListen)
		}
		return true
	case 0:
	default:
		con.printf("enrollment brought only some of %s, %s, %s: no TLS listener", TLSCertPath, TLSKeyPath, TLSClientCAPath)
	}
	if len(s.Listen) == 0 {
		con.printf("kernel command line: shardfs.listen: missing, and no enrollment (shardfs.enroll) brought the TLS files for the default %s: nothing would export the tree", DefaultListen)
		return false
	}
	for _, l := range s.Listen {
		if strings.HasPrefix(l, "tls!") {
			con.printf("kernel command line: shardfs.listen=%s: no TLS files (the node did not enroll: no shardfs.enroll, or the enrollment server has no --tls-client-ca)", l)
			return false
		}
	}
	return true
}

// etcdFiles sets etcd's TLS files that enrollment brought.
func etcdFiles(con *console, root string, s *Settings) {
	if _, err := os.Stat(root + EtcdCAPath); err == nil {
		s.EtcdCA = root + EtcdCAPath
	}
	_, errCert := os.Stat(root + EtcdCertPath)
	_, errKey := os.Stat(root + EtcdKeyPath)
	if errCert == nil && errKey == nil {
		s.EtcdCert, s.EtcdKey = root+EtcdCertPath, root+EtcdKeyPath
	}
	con.printf("etcd: %s, CA %s, client certificate %s", strings.Join(s.Etcd, ","), orNone(s.EtcdCA), orNone(s.EtcdCert))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// NodeName is the name of a node whose command line names none: the
// host name DHCP gave, or else "pxe-" and the NIC's hardware address with
// dashes (pxe-52-54-00-12-34-56), unique on the boot network.
func NodeName(dhcpHostname string, mac net.HardwareAddr) string {
	if h := strings.TrimSpace(dhcpHostname); h != "" && !strings.ContainsAny(h, "/ \t") {
		return h
	}
	if len(mac) == 0 {
		return "pxe-node"
	}
	return "pxe-" + strings.ReplaceAll(mac.String(), ":", "-")
}

// readToken reads and removes the token enrollment left: from then on
// it lives only in the node's memory. Without it the console says what
// the node does instead.
func readToken(con *console, root string) string {
	b, err := os.ReadFile(root + TokenPath)
	if errors.Is(err, fs.ErrNotExist) {
		con.printf("no token: no %s (no shardfs.enroll on the kernel command line, or the enrollment server has no --token-file); the node serves its tree and every shard is FATAL with \"no token\"", TokenPath)
		return ""
	}
	if err != nil {
		con.printf("no token: %v; the node serves its tree and every shard is FATAL with \"no token\"", err)
		return ""
	}
	if err := os.Remove(root + TokenPath); err != nil {
		con.printf("removing %s after reading it: %v", TokenPath, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		con.printf("no token: %s is empty; the node serves its tree and every shard is FATAL with \"no token\"", TokenPath)
	}
	return tok
}

// refuse keeps the refusal on the console, once a minute, until ctx ends:
// an operator who attaches to the console late still sees why.
func refuse(ctx context.Context, clk clock.Clock, con *console) error {
	for {
		timer := startTimer(clk, time.Minute)
		con.printf("refusing to start the node: fix the shardfs.* keys above on the kernel command line and reboot")
		if err := timer.wait(ctx); err != nil {
			return err
		}
	}
}

// retry calls f until it succeeds or ctx ends, printing each failure and
// the wait before the next try. The wait doubles from RetryMin to
// RetryMax, and starts again from RetryMin after a try that lasted
// RetryReset.
func retry(ctx context.Context, clk clock.Clock, con *console, what string, f func() error) error {
	wait := RetryMin
	for {
		start := clock.Mono(clk)
		err := f()
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		if clock.Mono(clk)-start >= RetryReset {
			wait = RetryMin
		}
		// The timer runs before the line shows, so that whoever reads
		// the line may move the clock past it.
		timer := startTimer(clk, wait)
		con.printf("%s failed: %v; retrying in %v", what, err, wait)
		if err := timer.wait(ctx); err != nil {
			return err
		}
		wait = min(2*wait, RetryMax)
	}
}

// timer is a started wait.
type timer struct {
	t    clock.Timer
	done chan struct{}
}

func startTimer(clk clock.Clock, d time.Duration) timer {
	done := make(chan struct{})
	return timer{t: clk.AfterFunc(d, func() { close(done) }), done: done}
}

// wait returns when the timer fires, or ctx's error.
func (t timer) wait(ctx context.Context) error {
	defer t.t.Stop()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkClock prints the time and moves a clock that is certainly wrong
// (before this build) forward to the build's time, as systemd does: TLS
// then at least accepts certificates issued before the build.
func checkClock(con *console, clk clock.Clock) {
	now, floor := clk.Now(), clockFloor()
	if !now.Before(floor) {
		con.printf("clock: %s (the kernel set it from the RTC)", now.UTC().Format(time.RFC3339))
		return
	}
	tv := unix.NsecToTimeval(floor.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		con.printf("clock: %s is before this build (%s) and setting it failed: %v; TLS will refuse valid certificates: set the RTC", now.UTC().Format(time.RFC3339), floor.Format(time.RFC3339), err)
		return
	}
	con.printf("clock: %s is before this build; moved to %s; set the RTC, or TLS may refuse valid certificates", now.UTC().Format(time.RFC3339), floor.Format(time.RFC3339))
}

// waitEntropy waits, visibly, until the kernel's random number generator
// is ready: DHCP transaction IDs, TLS keys and Go's crypto/rand block on it
// until then, silently. CPUs with RDRAND (and Debian's kernel, which
// trusts it) have it at boot; a VM without it needs virtio-rng.
func waitEntropy(con *console, clk clock.Clock) {
	var b [1]byte
	if _, err := unix.Getrandom(b[:], unix.GRND_NONBLOCK); err != unix.EAGAIN {
		return
	}
	con.printf("waiting for the kernel's random number generator (no RDRAND? give a VM virtio-rng, a server its hardware RNG module)")
	start := clock.Mono(clk)
	for {
		if _, err := unix.Getrandom(b[:], 0); err != unix.EINTR {
			break
		}
	}
	con.printf("random number generator ready after %v", (clock.Mono(clk) - start).Round(time.Millisecond))
}

// console writes PID 1's progress lines, one write per line, so that the
// kernel's own messages do not cut them.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *console) printf(format string, args ...any) {
	line := fmt.Sprintf("shardfs-init: "+format+"\n", args...)
	c.mu.Lock()
	defer c.mu.Unlock()
	io.WriteString(c.w, line)
}
