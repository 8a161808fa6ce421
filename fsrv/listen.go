package fsrv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultAddr is the address Listen uses for "".
const DefaultAddr = "tcp!127.0.0.1!5640"

// DefaultSocket is the unix socket a node listens on by default and a
// client tries first: /run/shardfs.sock for root, else
// shardfs-UID.sock in RuntimeDir.
func DefaultSocket() string {
	if os.Getuid() == 0 {
		return "/run/shardfs.sock"
	}
	return filepath.Join(RuntimeDir(), fmt.Sprintf("shardfs-%d.sock", os.Getuid()))
}

// RuntimeDir is the folder of a user's default socket and of the other
// files only that user may reach (the simulator's token): /run for
// root, $XDG_RUNTIME_DIR when set (a 0700 folder the login manager
// makes), else $HOME/.cache/shardfs. Never the temporary folder: anyone
// may create a name there first, a socket that collects the commands
// meant for the tree, or a file that denies the name (DESIGN 7.7).
// EnsureRuntimeDir makes it and checks it.
func RuntimeDir() string { return runtimeDir(os.Getuid()) }

func runtimeDir(uid int) string {
	if uid == 0 {
		return "/run"
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/nonexistent" // EnsureRuntimeDir then says what to set
	}
	return filepath.Join(home, ".cache", "shardfs")
}

// ErrUnsafeDir is the error of a runtime folder another user owns or
// may write in.
var ErrUnsafeDir = errors.New("another user owns the folder or may write in it")

// EnsureRuntimeDir creates RuntimeDir (mode 0700) when it is missing and
// refuses it when another user owns it or group or others may write in
// it.
func EnsureRuntimeDir() error { return ensureDir(RuntimeDir()) }

func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("fsrv: the runtime folder %s: %w (set XDG_RUNTIME_DIR to a folder of your own, or give --listen unix!PATH)", dir, err)
	}
	return CheckPrivateDir(dir)
}

// CheckPrivateDir refuses a folder that is not this user's alone to
// write in: owned by another user (root's is accepted, for /run), or
// writable by group or others.
func CheckPrivateDir(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return fmt.Errorf("fsrv: %s: %w", dir, err)
	}
	uid := os.Getuid()
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return fmt.Errorf("fsrv: %s: not a folder", dir)
	}
	if int(st.Uid) != uid && st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("fsrv: %s (owner uid %d, mode %04o): %w; the socket and the files beside it must be this user's (uid %d) alone", dir, st.Uid, st.Mode&0o7777, ErrUnsafeDir, uid)
	}
	return nil
}

// ListenAddr is a listen address taken apart: where to listen, and the
// options written after it.
type ListenAddr struct {
	Network, Address string
	// ReadOnly (",ro"): the listener's connections may write nothing
	// and do not see private nodes.
	ReadOnly bool
	// Insecure (",insecure"): plain TCP on an address that is not
	// loopback is allowed.
	Insecure bool
	// TLS (tls!host!port): 9P over TLS 1.3 on TCP; Network is "tcp".
	TLS bool
	// MaxConns (",max=N") is the listener's own connection cap (see
	// Server.Serve); zero means the default.
	MaxConns int
	// CA (",ca=FILE", tls! only) is the CA the listener's client
	// certificates must chain to, in place of --tls-client-ca; Clients
	// (",clients=FILE", tls! only) its rules file (see Rules).
	CA, Clients string
}

// ParseListenAddr parses a listen address: a dial string as ParseAddr
// takes, then options, each after a comma: ",ro", ",insecure",
// ",max=N", and for tls! ",ca=FILE" and ",clients=FILE". An
// unknown option is an error. The first comma starts the options, so a
// unix socket path cannot contain one.
func ParseListenAddr(addr string) (ListenAddr, error) {
	base, opts, _ := strings.Cut(addr, ",")
	var la ListenAddr
	if opts != "" || strings.HasSuffix(addr, ",") {
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "ro":
				la.ReadOnly = true
			case "insecure":
				la.Insecure = true
			default:
				name, val, _ := strings.Cut(o, "=")
				switch name {
				case "max":
					n, err := strconv.Atoi(val)
					if err != nil || n < 1 {
						return ListenAddr{}, fmt.Errorf("%w: %q: max=%q: want a connection count of 1 or more", fs.ErrInvalid, addr, val)
					}
					la.MaxConns = n
				case "ca", "clients":
					if val == "" {
						return ListenAddr{}, fmt.Errorf("%w: %q: %s= names no file", fs.ErrInvalid, addr, name)
					}
					if name == "ca" {
						la.CA = val
					} else {
						la.Clients = val
					}
				default:
					return ListenAddr{}, fmt.Errorf("%w: %q: unknown listener option %q (known: ro, insecure, max=N, ca=FILE, clients=FILE)", fs.ErrInvalid, addr, o)
				}
			}
		}
	}
	var err error
	if la.Network, la.Address, err = parseAddr(base); err != nil {
		return ListenAddr{}, err
	}
	if la.Network == "tls" {
		la.Network, la.TLS = "tcp", true
	}
	if !la.TLS && (la.CA != "" || la.Clients != "") {
		return ListenAddr{}, fmt.Errorf("%w: %q: ca= and clients= are options of a tls! listener", fs.ErrInvalid, addr)
	}
	return la, nil
}

// ParseAddr turns a listen address into a network and an address for
// net.Listen. It accepts Plan 9 dial strings (tcp!host!port, unix!path,
// with * or an empty host for every interface), host:port, and a bare path
// (anything with a '/' or without a ':'), which is a unix socket. "" is
// DefaultAddr. tls!host!port is network "tls": TCP carrying TLS (see
// Dial). Listener options (see ParseListenAddr) are checked and left out.
func ParseAddr(addr string) (network, address string, err error) {
	la, err := ParseListenAddr(addr)
	if la.TLS {
		return "tls", la.Address, err
	}
	return la.Network, la.Address, err
}

func parseAddr(addr string) (network, address string, err error) {
	if addr == "" {
		addr = DefaultAddr
	}
	if proto, rest, ok := strings.Cut(addr, "!"); ok {
		switch proto {
		case "tcp", "tcp4", "tcp6", "tls":
			host, port, ok := strings.Cut(rest, "!")
			if !ok || port == "" || strings.Contains(port, "!") {
				return "", "", fmt.Errorf("%w: %q: want %s!host!port", fs.ErrInvalid, addr, proto)
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

// ErrInsecure is returned by Listen for plain TCP on an address that is
// not loopback without ",insecure".
var ErrInsecure = errors.New("plain TCP beyond loopback")

// Listen listens on addr (see ParseListenAddr); it is ListenTLS without a
// TLS configuration, so a tls! address is refused.
func Listen(addr string) (net.Listener, error) { return ListenTLS(addr, nil) }

// ListenTLS listens on addr (see ParseListenAddr). A unix socket is created
// with mode 0600, replacing a stale socket file left by a server that is
// gone; it is removed when the listener is closed. Plain TCP is refused
// on an address that is not loopback (every interface included) unless
// addr says ",insecure": 9P has no encryption, and the tree takes
// commands. A tls!host!port listener serves 9P over TLS with conf (see
// ServerTLSConfig), on any address; without conf it is ErrNoTLSConfig.
// With ",ro" the listener is ReadOnly; with ",max=N", WithMaxConns.
func ListenTLS(addr string, conf *tls.Config) (net.Listener, error) {
	la, err := ParseListenAddr(addr)
	if err != nil {
		return nil, err
	}
	if la.TLS && (conf == nil || len(conf.Certificates) == 0 && conf.GetCertificate == nil || conf.ClientCAs == nil) {
		return nil, fmt.Errorf("fsrv: listen %s: %w", addr, ErrNoTLSConfig)
	}
	var auth *tlsAuth
	if la.TLS {
		auth = staticAuth(conf)
	}
	return openListener(la, auth)
}

// openListener opens la; a tls! one serves with auth's policy of the moment.
func openListener(la ListenAddr, auth *tlsAuth) (net.Listener, error) {
	var l net.Listener
	var err error
	if la.Network == "unix" {
		l, err = listenUnix(la.Address)
	} else {
		if !la.Insecure && !la.TLS {
			if err := checkLoopback(la.Address); err != nil {
				return nil, err
			}
		}
		l, err = net.Listen(la.Network, la.Address)
	}
	if err != nil {
		return nil, err
	}
	if la.TLS {
		l = tlsListener{l, auth}
	}
	if la.MaxConns > 0 {
		l = WithMaxConns(l, la.MaxConns)
	}
	if la.ReadOnly {
		l = ReadOnly(l)
	}
	return l, nil
}

// checkLoopback refuses a TCP address that may be reached from another
// machine: any host that does not resolve to loopback addresses only.
func checkLoopback(address string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	refuse := func() error {
		h := host
		if h == "" {
			h = "*"
		}
		return fmt.Errorf("fsrv: listen tcp!%s!%s: %w: 9P is not encrypted and the tree takes commands; use tls!%s!%s, or add ,insecure to serve plain TCP anyway", h, port, ErrInsecure, h, port)
	}
	if host == "" {
		return refuse()
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		addrs, err := net.DefaultResolver.LookupIPAddr(context.Background(), host)
		if err != nil {
			return fmt.Errorf("fsrv: listen %s: %w", address, err)
		}
		ips = ips[:0]
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	for _, ip := range ips {
		if ip == nil || !ip.IsLoopback() {
			return refuse()
		}
	}
	return nil
}

// ReadOnly returns a listener whose connections Server.Serve serves
// read-only: every write, truncation or attribute change is refused with
// permission denied (EACCES), and private nodes are absent from listings
// and walks.
func ReadOnly(l net.Listener) net.Listener { return readOnlyListener{l} }

type readOnlyListener struct{ net.Listener }

func isReadOnly(l net.Listener) bool {
	for ; l != nil; l = inner(l) {
		if _, ok := l.(readOnlyListener); ok {
			return true
		}
	}
	return false
}

// WithMaxConns returns a listener whose connections Server.Serve serves
// at most max at once (ListenTLS's ",max=N"); past it a new connection
// is told that the server is full. Without it a TCP or TLS listener
// takes DefaultListenerConns, a unix socket Server.MaxConns.
func WithMaxConns(l net.Listener, max int) net.Listener { return capListener{l, max} }

type capListener struct {
	net.Listener
	max int
}

func maxConnsOf(l net.Listener) int {
	for ; l != nil; l = inner(l) {
		if c, ok := l.(capListener); ok {
			return c.max
		}
	}
	return 0
}

// inner is the listener a wrapper of this package wraps, or nil.
func inner(l net.Listener) net.Listener {
	switch w := l.(type) {
	case readOnlyListener:
		return w.Listener
	case capListener:
		return w.Listener
	}
	return nil
}

func listenUnix(path string) (net.Listener, error) {
	if filepath.Dir(path) == RuntimeDir() {
		if err := EnsureRuntimeDir(); err != nil {
			return nil, err
		}
	}
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
