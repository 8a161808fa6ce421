package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hugelgupf/p9/linux"

	"github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/fsrv"
)

// runClient is the built-in 9P client for machines that cannot mount the
// tree: ls, cat, write and tail over 9P2000.L (package client).
func runClient(ctx context.Context, cmd string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fl.SetOutput(stderr)
	addr := fl.String("addr", "", "the tree's 9P address: unix!path, a path, tcp!host!port, host:port or tls!host!port (default: serve's unix socket unix!"+fsrv.DefaultSocket()+", then "+fsrv.DefaultAddr+")")
	var cf clientTLSFlags
	cf.register(fl)
	lines := fl.Int("n", 10, "tail: lines to print before following")
	once := fl.Bool("once", false, "tail: print the last lines and exit instead of following")
	if err := fl.Parse(args); err != nil {
		return err
	}
	rest := fl.Args()
	switch {
	case len(rest) < 1 && cmd == "ls":
		rest = []string{"/"}
	case len(rest) < 1:
		return fmt.Errorf("%s needs a PATH", cmd)
	case len(rest) > 2 || len(rest) == 2 && cmd != "write":
		return fmt.Errorf("%s: unexpected argument %q", cmd, rest[len(rest)-1])
	}
	conf, err := cf.config(*addr)
	if err != nil {
		return err
	}
	c, err := client.Dial(ctx, *addr, client.WithTLS(conf))
	if err != nil {
		return err
	}
	defer c.Close()
	path := rest[0]
	switch cmd {
	case "ls":
		return ls(c, path, stdout)
	case "cat":
		return c.Copy(stdout, path)
	case "write":
		var text []byte
		if len(rest) == 2 {
			text = []byte(rest[1])
			if !bytes.HasSuffix(text, []byte("\n")) {
				text = append(text, '\n')
			}
		} else if text, err = io.ReadAll(stdin); err != nil {
			return err
		}
		err := c.WriteFile(path, text)
		if errors.Is(err, linux.EACCES) {
			return fmt.Errorf("%w (%s)", err, whyReadOnly(c, path, conf != nil))
		}
		return err
	}
	if *once {
		last, err := c.LastLines(path, *lines)
		if err != nil {
			return err
		}
		_, err = stdout.Write(last)
		return err
	}
	return c.Tail(ctx, path, *lines, stdout)
}

// whyReadOnly says why a write to path was refused with EACCES, which
// is all 9P2000.L tells. On a read-write connection the root's ctl
// shows its write bits: then the file itself takes no writes. Else the
// connection is read-only: by its listener's ,ro, or, over TLS, by the
// listener's rules file naming this certificate ro, which the server
// does not tell apart to a 9P2000.L client (its log and a 9P2000 error
// do).
func whyReadOnly(c *client.Client, path string, tls bool) string {
	if fi, err := c.Stat("ctl"); err == nil && fi.Mode().Perm()&0o222 != 0 {
		return path + " is read-only: no listener takes writes to it"
	}
	network, _, _ := fsrv.ParseAddr(c.Addr())
	switch {
	case tls:
		return fmt.Sprintf("a read-only listener or certificate: %s is served with ,ro, or its rules file (,clients=FILE) names this certificate ro; ask the node's operator for read-write", c.Addr())
	case strings.HasPrefix(network, "tcp"):
		return fmt.Sprintf("a read-only listener: %s is served with ,ro (serve's %s is by default); write through its unix socket, --addr unix!%s", c.Addr(), fsrv.DefaultAddr, fsrv.DefaultSocket())
	}
	return fmt.Sprintf("a read-only listener: %s is served with ,ro", c.Addr())
}

// ls prints a directory's names, a directory's with a slash after it, or
// a file's mode, size and path.
func ls(c *client.Client, path string, w io.Writer) error {
	fi, err := c.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		fmt.Fprintf(w, "%v %d %s\n", fi.Mode(), fi.Size(), path)
		return nil
	}
	ents, err := c.List(path)
	for _, e := range ents {
		suffix := ""
		if e.Dir {
			suffix = "/"
		}
		fmt.Fprintf(w, "%s%s\n", e.Name, suffix)
	}
	return err
}

// clientTLSFlags are the client's --cert, --key and --ca.
type clientTLSFlags struct{ cert, key, ca string }

func (f *clientTLSFlags) register(fl *flag.FlagSet) {
	fl.StringVar(&f.cert, "cert", "", "tls! addresses: this client's certificate (PEM; default $SHARDFS_CERT)")
	fl.StringVar(&f.key, "key", "", "tls! addresses: this client's key (PEM; default $SHARDFS_KEY)")
	fl.StringVar(&f.ca, "ca", "", "tls! addresses: the CA certificate (PEM) that signed the server's certificate (default $SHARDFS_CA)")
}

// fromEnv fills what the flags left empty from SHARDFS_CERT, SHARDFS_KEY
// and SHARDFS_CA, so that scripts (examples/shell with 9p!tls!...) reach
// a tls! listener without passing them.
func (f *clientTLSFlags) fromEnv() {
	for _, v := range []struct {
		p   *string
		env string
	}{{&f.cert, "SHARDFS_CERT"}, {&f.key, "SHARDFS_KEY"}, {&f.ca, "SHARDFS_CA"}} {
		if *v.p == "" {
			*v.p = os.Getenv(v.env)
		}
	}
}

// config is the TLS configuration for a tls! address, nil for another;
// "" stands for client.DefaultAddrs, none of which is tls!.
func (f clientTLSFlags) config(addr string) (*tls.Config, error) {
	network := ""
	if addr != "" {
		var err error
		if network, _, err = fsrv.ParseAddr(addr); err != nil {
			return nil, err
		}
	}
	if network != "tls" {
		if f.cert != "" || f.key != "" || f.ca != "" {
			if addr == "" {
				addr = "the default addresses"
			}
			return nil, fmt.Errorf("--cert, --key and --ca are for tls! addresses, not %s", addr)
		}
		return nil, nil
	}
	f.fromEnv()
	if f.cert == "" || f.key == "" || f.ca == "" {
		return nil, fmt.Errorf("%s: a tls! address needs --cert and --key (this client's certificate) and --ca (the CA of the server's), or SHARDFS_CERT, SHARDFS_KEY and SHARDFS_CA", addr)
	}
	return fsrv.ClientTLSConfig(f.cert, f.key, f.ca)
}
