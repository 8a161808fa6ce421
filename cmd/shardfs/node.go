package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/node"
)

// listenFlag collects repeated --listen values.
type listenFlag []string

func (l *listenFlag) String() string     { return strings.Join(*l, ",") }
func (l *listenFlag) Set(s string) error { *l = append(*l, s); return nil }

// defaultSocket is the unix socket serve and demo listen on by default.
func defaultSocket() string {
	if os.Getuid() == 0 {
		return "/run/shardfs.sock"
	}
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return fmt.Sprintf("%s/shardfs-%d.sock", dir, os.Getuid())
}

// serveListeners are DESIGN.md's defaults (section 7.7): read-write on a
// unix socket only its owner can use (mode 0600), read-only on loopback
// TCP, whose port any local user can reach.
func serveListeners() []string {
	return []string{"unix!" + defaultSocket(), fsrv.DefaultAddr + ",ro"}
}

// demoListeners keep loopback TCP read-write: the demo holds no token and
// drives a simulator, and its how-to mounts over TCP.
func demoListeners() []string {
	return []string{fsrv.DefaultAddr, "unix!" + defaultSocket()}
}

// listener is an open listener and how it was asked for.
type listener struct {
	l  net.Listener // as fsrv.Listen made it: Server.Serve reads its options
	ro bool
}

// tlsFlags are serve's --tls-cert, --tls-key and --tls-client-ca; leaf is
// the server certificate once config loaded it.
type tlsFlags struct {
	cert, key, clientCA string
	leaf                *x509.Certificate
}

func (f *tlsFlags) register(fl *flag.FlagSet) {
	fl.StringVar(&f.cert, "tls-cert", "", "tls! listeners: the server's certificate (PEM)")
	fl.StringVar(&f.key, "tls-key", "", "tls! listeners: the server certificate's key (PEM)")
	fl.StringVar(&f.clientCA, "tls-client-ca", "", "tls! listeners: the CA certificate(s) (PEM) client certificates must chain to")
}

// config loads the TLS configuration when a tls! listener needs it.
func (f *tlsFlags) config(addrs []string) (*tls.Config, error) {
	var tlsAddr string
	for _, a := range addrs {
		if la, err := fsrv.ParseListenAddr(a); err == nil && la.TLS {
			tlsAddr = a
			break
		}
	}
	if tlsAddr == "" {
		return nil, nil
	}
	if f.cert == "" || f.key == "" || f.clientCA == "" {
		return nil, fmt.Errorf("--listen %s: a tls listener needs --tls-cert, --tls-key and --tls-client-ca (shardfs certs makes them)", tlsAddr)
	}
	conf, err := fsrv.ServerTLSConfig(f.cert, f.key, f.clientCA)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", tlsAddr, err)
	}
	f.leaf = conf.Certificates[0].Leaf
	return conf, nil
}

// logCert says which certificate the tls! listeners present, and warns
// when it expires within 30 days or is not valid now.
func (f *tlsFlags) logCert(log *slog.Logger, now time.Time) {
	c := f.leaf
	if c == nil {
		return
	}
	names := append(append([]string(nil), c.DNSNames...), ipStrings(c.IPAddresses)...)
	args := []any{"cert", f.cert, "cn", c.Subject.CommonName, "names", strings.Join(names, ","), "not_after", c.NotAfter.UTC().Format(time.RFC3339)}
	switch {
	case now.Before(c.NotBefore) || now.After(c.NotAfter):
		log.Warn("the TLS listeners' certificate is not valid now: clients will refuse it (or this machine's clock is wrong)", append(args, "not_before", c.NotBefore.UTC().Format(time.RFC3339))...)
	case c.NotAfter.Sub(now) < 30*24*time.Hour:
		log.Warn("the TLS listeners' certificate expires within 30 days: shardfs certs server makes a new one", args...)
	default:
		log.Info("TLS listeners' certificate", args...)
	}
}

// listen opens every address (defaults when addrs is empty); on failure it
// closes those already open. Every address is parsed before any is opened.
// tf's configuration serves the tls! listeners.
func listen(addrs, defaults []string, tf *tlsFlags) ([]listener, error) {
	if len(addrs) == 0 {
		addrs = defaults
	}
	ls := make([]listener, 0, len(addrs))
	for _, a := range addrs {
		la, err := fsrv.ParseListenAddr(a)
		if err != nil {
			return nil, fmt.Errorf("--listen: %w", err) // it quotes the address
		}
		ls = append(ls, listener{ro: la.ReadOnly})
	}
	conf, err := tf.config(addrs)
	if err != nil {
		return nil, err
	}
	for i, a := range addrs {
		l, err := fsrv.ListenTLS(a, conf)
		if err != nil {
			closeListeners(ls[:i])
			if errors.Is(err, fsrv.ErrInsecure) {
				return nil, err // it names the address and the TLS alternative
			}
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		ls[i].l = l
	}
	return ls, nil
}

func closeListeners(ls []listener) {
	for _, l := range ls {
		if l.l != nil {
			l.l.Close()
		}
	}
}

func netListeners(ls []listener) []net.Listener {
	out := make([]net.Listener, len(ls))
	for i, l := range ls {
		out[i] = l.l
	}
	return out
}

// access names a listener's mode in log lines.
func (l listener) access() string {
	if l.ro {
		return "read-only"
	}
	return "read-write"
}

// addrString writes a listener's address in the tree's own syntax, the
// one --addr takes.
func addrString(l net.Listener) string {
	a := l.Addr()
	if a.Network() == "unix" {
		return "unix!" + a.String()
	}
	host, port, _ := net.SplitHostPort(a.String())
	proto := "tcp"
	if fsrv.IsTLS(l) {
		proto = "tls"
	}
	return proto + "!" + host + "!" + port
}

// newLogger logs to w without ever waiting for it (see asyncHandler); stop
// flushes it. On a terminal, status draws a line that stays below the log
// (see console); elsewhere status is nil.
func newLogger(w io.Writer, debug bool) (log *slog.Logger, status func(line string, final bool), stop func()) {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	var con *console
	out := w
	if isTerminal(w) {
		fd := int(w.(*os.File).Fd())
		con = &console{w: w, width: func() int {
			ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
			if err != nil {
				return 0
			}
			return int(ws.Col)
		}}
		out = con
	}
	h, stop := newAsyncHandler(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}), 8192, con)
	if con != nil {
		status = h.(*asyncHandler).q.status
	}
	return slog.New(h), status, stop
}

// runNode serves the node until ctx ends, then shuts it down cleanly.
func runNode(ctx context.Context, n *node.Node, ls []net.Listener, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, ls...) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		cancel()
	}
	log.Info("shutting down: closing gateway connections with 4000 so that sessions stay resumable")
	cerr := n.Close()
	if err == nil {
		err = <-served
	}
	return errors.Join(err, cerr)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progress reports startup: shards READY out of the local total, the next
// identify slot and an estimate of the time left. On a terminal (status
// not nil) it redraws one status line; elsewhere it logs every 10 s. It
// looks again at every lifecycle event and returns once every shard is
// READY (or FATAL), or ctx ends.
func progress(ctx context.Context, n *node.Node, log *slog.Logger, status func(line string, final bool)) {
	tty := status != nil
	interval := 10 * time.Second
	if tty {
		interval = 500 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	start := time.Now()
	diags := make([]core.Diag, 0, len(n.Scheduler.Plan().Local))
	events := n.Scheduler.Events()
	var line string
	for {
		cur, _ := n.Current() // after a move to a larger plan, the new one
		diags = cur.Snapshot(diags[:0])
		ready, fatal := 0, 0
		for _, d := range diags {
			switch d.State {
			case core.Ready:
				ready++
			case core.Fatal:
				fatal++
			}
		}
		waiting, next := n.Pacer.Waiting()
		left := n.Pacer.DrainTime().Round(time.Second)
		nextIn := "none"
		if !next.IsZero() {
			nextIn = time.Until(next).Round(100 * time.Millisecond).String()
		}
		done := ready+fatal == len(diags)
		if tty {
			line = fmt.Sprintf("startup: %d/%d READY, %d FATAL, %d waiting to identify, next slot in %s, about %s left", ready, len(diags), fatal, waiting, nextIn, left)
			if done {
				status(fmt.Sprintf("startup done in %s: %d READY, %d FATAL", time.Since(start).Round(time.Second), ready, fatal), true)
			} else {
				status(line, false)
			}
		} else if done {
			log.Info("startup done", "ready", ready, "fatal", fatal, "took", time.Since(start).Round(time.Second))
		} else {
			log.Info("startup", "ready", ready, "total", len(diags), "fatal", fatal, "identify_waiting", waiting, "next_slot_in", nextIn, "left", left)
		}
		if done {
			return
		}
		for quiet := true; quiet; {
			select {
			case <-ctx.Done():
				if tty {
					status(line, true)
				}
				return
			case <-tick.C:
				quiet = false
			case <-events.Notify():
				// Check for the end at once; report only on the tick.
				cur, _ := n.Current()
				quiet = !allSettled(cur.Snapshot(diags[:0]))
			}
		}
	}
}

func allSettled(diags []core.Diag) bool {
	for _, d := range diags {
		if d.State != core.Ready && d.State != core.Fatal {
			return false
		}
	}
	return true
}

// flagErr prints the flag set's usage along with a bad value.
func flagErr(fl *flag.FlagSet, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(fl.Output(), "%s: %v\n", fl.Name(), err)
	fl.Usage()
	return err
}
