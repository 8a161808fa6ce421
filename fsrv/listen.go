package fsrv

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultAddr is the address Listen uses for "".
const DefaultAddr = "tcp!127.0.0.1!5640"

// ParseAddr turns a listen address into a network and an address for
// net.Listen. It accepts Plan 9 dial strings (tcp!host!port, unix!path,
// with * or an empty host for every interface), host:port, and a bare path
// (anything with a '/' or without a ':'), which is a unix socket. "" is
// DefaultAddr.
func ParseAddr(addr string) (network, address string, err error) {
	if addr == "" {
		addr = DefaultAddr
	}
	if proto, rest, ok := strings.Cut(addr, "!"); ok {
		switch proto {
		case "tcp", "tcp4", "tcp6":
			host, port, ok := strings.Cut(rest, "!")
			if !ok || port == "" || strings.Contains(port, "!") {
				return "", "", fmt.Errorf("%w: %q: want tcp!host!port", fs.ErrInvalid, addr)
			}
			host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
			if host == "*" {
				host = ""
			}
			return proto, net.JoinHostPort(host, port), nil
		case "unix":
			if rest == "" {
				return "", "", fmt.Errorf("%w: %q: empty path", fs.ErrInvalid, addr)
			}
			return "unix", rest, nil
		}
		return "", "", fmt.Errorf("%w: %q: unknown network %q", fs.ErrInvalid, addr, proto)
	}
	if strings.Contains(addr, "/") || !strings.Contains(addr, ":") {
		return "unix", addr, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", fmt.Errorf("%w: %q: %v", fs.ErrInvalid, addr, err)
	}
	return "tcp", addr, nil
}

// Listen listens on addr (see ParseAddr). A unix socket is created with
// mode 0600, replacing a stale socket file left by a server that is gone;
// it is removed when the listener is closed.
func Listen(addr string) (net.Listener, error) {
	network, address, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	if network != "unix" {
		return net.Listen(network, address)
	}
	return listenUnix(address)
}

func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("fsrv: listen %s: %w: not a socket", path, fs.ErrExist)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("fsrv: listen %s: a server is listening there", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("fsrv: remove stale socket: %w", err)
		}
	}
	// Bind in a private directory and rename into place, so that the
	// socket is never reachable with a wider mode than 0600.
	dir, err := os.MkdirTemp(filepath.Dir(path), ".fsrv-")
	if err != nil {
		return nil, fmt.Errorf("fsrv: listen %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("fsrv: listen %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("fsrv: listen %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		return nil, fmt.Errorf("fsrv: listen %s: %w", path, err)
	}
	return &unixListener{UnixListener: l, path: path}, nil
}

// unixListener removes its socket file on Close: the listener itself
// would remove the name it was bound to, which was renamed.
type unixListener struct {
	*net.UnixListener
	path string
}

func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if err == nil {
		os.Remove(l.path)
	}
	return err
}
