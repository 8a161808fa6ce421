package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/fsrv"
)

// listenFlag collects repeated --listen values.
type listenFlag []string

func (l *listenFlag) String() string     { return strings.Join(*l, ",") }
func (l *listenFlag) Set(s string) error { *l = append(*l, s); return nil }

// serveListeners are DESIGN.md's defaults (section 7.7): read-write on a
// unix socket only its owner can use (mode 0600), read-only on loopback
// TCP, whose port any local user can reach.
func serveListeners() []string {
	return []string{"unix!" + fsrv.DefaultSocket(), fsrv.DefaultAddr + ",ro"}
}

// demoListeners keep loopback TCP read-write: the demo holds no token and
// drives a simulator, and its how-to mounts over TCP.
func demoListeners() []string {
	return []string{fsrv.DefaultAddr, "unix!" + fsrv.DefaultSocket()}
}

// tlsFlags are serve's --tls-cert, --tls-key and --tls-client-ca.
type tlsFlags struct {
	cert, key, clientCA string
}

func (f *tlsFlags) register(fl *flag.FlagSet) {
	fl.StringVar(&f.cert, "tls-cert", "", "tls! listeners: the server's certificate (PEM)")
	fl.StringVar(&f.key, "tls-key", "", "tls! listeners: the server certificate's key (PEM)")
	fl.StringVar(&f.clientCA, "tls-client-ca", "", "tls! listeners: the CA certificate(s) (PEM) client certificates must chain to")
}

func (f *tlsFlags) files() fsrv.TLSFiles {
	return fsrv.TLSFiles{Cert: f.cert, Key: f.key, ClientCA: f.clientCA}
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

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// flagErr prints the flag set's usage along with a bad value.
func flagErr(fl *flag.FlagSet, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(fl.Output(), "%s: %v\n", fl.Name(), err)
	fl.Usage()
	return err
}
