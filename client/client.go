// Package client reads, writes and follows the files of a shardfs tree over
// 9P2000.L, and forwards a kernel's trans=fd mount of the tree to it.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/fsrv"
)

// Client is a 9P2000.L session attached to the root of a tree. Its
// methods take paths relative to that root ("0/state", "/status"); they
// may be called from several goroutines.
type Client struct {
	addr string
	cl   *p9.Client
	root p9.File
	// poll is how often Tail looks for lines a log has gained.
	poll time.Duration
}

// DefaultAddrs are the addresses Dial tries for "", in order: the node's
// unix socket (read-write under serve), then loopback TCP (read-only
// under serve, read-write under demo).
func DefaultAddrs() []string {
	return []string{"unix!" + fsrv.DefaultSocket(), fsrv.DefaultAddr}
}

// Option configures Dial.
type Option func(*dialer)

type dialer struct {
	tls *tls.Config
}

// WithTLS gives the configuration for tls!host!port addresses: the CA of
// the server's certificate and this client's certificate (see
// fsrv.ClientTLSConfig). Other addresses ignore it.
func WithTLS(conf *tls.Config) Option {
	return func(d *dialer) { d.tls = conf }
}

// Dial connects to the tree at addr and attaches to its root. addr is a
// dial string as shardfs writes them: unix!PATH or a path,
// tcp!HOST!PORT or HOST:PORT, tls!HOST!PORT (which needs WithTLS). For
// "" it tries DefaultAddrs in turn and returns the first that answers;
// when none does, its error is a *DialError naming each address with
// its own error.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	var d dialer
	for _, o := range opts {
		o(&d)
	}
	if addr != "" {
		return d.dial(ctx, addr)
	}
	return d.dialFirst(ctx, DefaultAddrs())
}

// DialError is the error of a Dial that tried several addresses and
// reached none.
type DialError struct {
	Addrs []string // in the order they were tried
	Errs  []error  // Errs[i] is why Addrs[i] failed
}

func (e *DialError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no tree answered at any of the %d addresses tried:", len(e.Addrs))
	for i, a := range e.Addrs {
		fmt.Fprintf(&b, "\n\t%s: %v", a, e.Errs[i])
	}
	return b.String()
}

func (e *DialError) Unwrap() []error { return e.Errs }

func (d dialer) dialFirst(ctx context.Context, addrs []string) (*Client, error) {
	e := &DialError{Addrs: addrs}
	for _, a := range addrs {
		c, err := d.dial(ctx, a)
		if err == nil {
			return c, nil
		}
		e.Errs = append(e.Errs, err)
		if ctx.Err() != nil {
			e.Addrs = e.Addrs[:len(e.Errs)]
			break
		}
	}
	return nil, e
}

func (d dialer) dial(ctx context.Context, addr string) (*Client, error) {
	conn, err := DialConn(ctx, addr, d.tls)
	if err != nil {
		return nil, err
	}
	return newClient(conn, addr)
}

// New starts a 9P2000.L session on conn, which is already connected to
// a tree (by fsrv.Dial, a tunnel, a pipe in a test), and attaches to its
// root. The Client owns conn from then on, even when New fails.
func New(conn net.Conn) (*Client, error) {
	return newClient(conn, conn.RemoteAddr().String())
}

func newClient(conn net.Conn, addr string) (*Client, error) {
	cl, err := p9.NewClient(conn)
	if err != nil {
		conn.Close()
		if errors.Is(err, linux.ENFILE) {
			// What fsrv answers a Tversion past its connection budgets.
			return nil, fmt.Errorf("%s: %w: it refused this connection at its connection limit; try again later", addr, fsrv.ErrServerFull)
		}
		return nil, fmt.Errorf("9P handshake with %s: %w", addr, err)
	}
	root, err := cl.Attach("")
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("attach %s: %w", addr, err)
	}
	return &Client{addr: addr, cl: cl, root: root, poll: 500 * time.Millisecond}, nil
}

// Addr is the address the client reached: the one Dial was given, or
// the first of DefaultAddrs that answered.
func (c *Client) Addr() string { return c.addr }

// Close ends the session and closes its connection.
func (c *Client) Close() error {
	return errors.Join(c.root.Close(), c.cl.Close())
}

// walk returns a new fid for path; the caller closes it.
func (c *Client) walk(path string) (p9.File, error) {
	var names []string
	for _, n := range strings.Split(path, "/") {
		if n != "" && n != "." {
			names = append(names, n)
		}
	}
	_, f, err := c.root.Walk(names)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// openRead walks to path and opens it for reading.
func (c *Client) openRead(path string) (p9.File, error) {
	f, err := c.walk(path)
	if err != nil {
		return nil, err
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}
