package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/fsrv"
)

// runClient is the built-in 9P client for machines that cannot mount the
// tree: ls, cat, write and tail over 9P2000.L.
func runClient(ctx context.Context, cmd string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fl.SetOutput(stderr)
	addr := fl.String("addr", defaultClientAddr(), "the tree's 9P address: unix!path, a path, tcp!host!port, host:port or tls!host!port (default: serve's unix socket when it exists, else "+fsrv.DefaultAddr+")")
	var cf clientTLSFlags
	cf.register(fl)
	lines := fl.Int("n", 10, "tail: lines to print before following")
	once := fl.Bool("once", false, "tail: print the last lines and exit instead of following")
	if err := fl.Parse(args); err != nil {
		return err
	}
	rest := fl.Args()
	switch {
	case len(rest) < 1:
		return fmt.Errorf("%s needs a PATH", cmd)
	case len(rest) > 2 || len(rest) == 2 && cmd != "write":
		return fmt.Errorf("%s: unexpected argument %q", cmd, rest[len(rest)-1])
	}
	conf, err := cf.config(*addr)
	if err != nil {
		return err
	}
	root, closeFn, err := dial(ctx, *addr, conf)
	if err != nil {
		return err
	}
	defer closeFn()
	path := rest[0]
	switch cmd {
	case "ls":
		return ls(root, path, stdout)
	case "cat":
		return cat(root, path, stdout)
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
		isCtl := strings.HasSuffix(strings.TrimSuffix(path, "/"), "ctl")
		var since int64
		if isCtl {
			since = eventsSize(root, path)
		}
		err := write(root, path, text)
		if errors.Is(err, linux.EACCES) && conf != nil {
			return fmt.Errorf("%w (a read-only listener: %s is served with ,ro; ask the node's operator for a read-write tls! listener)", err, *addr)
		}
		if errors.Is(err, linux.EACCES) {
			return fmt.Errorf("%w (a read-only listener: serve's %s is ,ro by default; write through its unix socket, --addr unix!%s)", err, fsrv.DefaultAddr, defaultSocket())
		}
		if err != nil && isCtl {
			// 9P2000.L carries only the errno; the reason is in the events
			// log next to the ctl file.
			if why := lastRejection(root, path, since); why != "" {
				err = fmt.Errorf("%w\n%s", err, why)
			}
		}
		return err
	}
	return tail(ctx, root, path, *lines, *once, stdout)
}

// defaultClientAddr is where a client finds the tree read-write: serve's
// unix socket when it is there, else loopback TCP (read-only under serve,
// read-write under demo).
func defaultClientAddr() string {
	if fi, err := os.Stat(defaultSocket()); err == nil && fi.Mode().Type() == fs.ModeSocket {
		return "unix!" + defaultSocket()
	}
	return fsrv.DefaultAddr
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

// config is the TLS configuration for a tls! address, nil for another.
func (f clientTLSFlags) config(addr string) (*tls.Config, error) {
	network, _, err := fsrv.ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	if network != "tls" {
		if f.cert != "" || f.key != "" || f.ca != "" {
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

func dial(ctx context.Context, addr string, conf *tls.Config) (p9.File, func(), error) {
	conn, err := fsrv.Dial(ctx, addr, conf)
	if err != nil {
		return nil, nil, err
	}
	cl, err := p9.NewClient(conn)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("9P handshake with %s: %w", addr, err)
	}
	root, err := cl.Attach("")
	if err != nil {
		cl.Close()
		return nil, nil, fmt.Errorf("attach %s: %w", addr, err)
	}
	return root, func() { root.Close(); cl.Close() }, nil
}

func walk(root p9.File, path string) (p9.File, error) {
	var names []string
	for _, n := range strings.Split(path, "/") {
		if n != "" && n != "." {
			names = append(names, n)
		}
	}
	_, f, err := root.Walk(names)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

func ls(root p9.File, path string, w io.Writer) error {
	f, err := walk(root, path)
	if err != nil {
		return err
	}
	defer f.Close()
	qid, _, attr, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if qid.Type&p9.TypeDir == 0 {
		fmt.Fprintf(w, "%v %d %s\n", fs.FileMode(attr.Mode.Permissions()), attr.Size, path)
		return nil
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for off := uint64(0); ; {
		ents, err := f.Readdir(off, 1024)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(ents) == 0 {
			return nil
		}
		for _, e := range ents {
			if e.Name == "." || e.Name == ".." {
				continue
			}
			suffix := ""
			if e.QID.Type&p9.TypeDir != 0 {
				suffix = "/"
			}
			fmt.Fprintf(w, "%s%s\n", e.Name, suffix)
		}
		off = ents[len(ents)-1].Offset
	}
}

// lastRejection returns the newest "event=rejected" line of the events log
// beside a ctl file, or "".
func lastRejection(root p9.File, ctlPath string, since int64) string {
	f, err := openRead(root, eventsBeside(ctlPath))
	if err != nil {
		return ""
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil {
		return ""
	}
	var buf bytes.Buffer
	if _, err := copyFrom(f, max(size-16<<10, since), &buf); err != nil {
		return ""
	}
	lines := strings.Split(buf.String(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], " event=rejected ") {
			return lines[i]
		}
	}
	return ""
}

// eventsBeside names the events log in the directory of a ctl file.
func eventsBeside(ctlPath string) string {
	return strings.TrimSuffix(strings.TrimSuffix(ctlPath, "/"), "ctl") + "events"
}

// eventsSize is the size of the events log beside a ctl file, so that
// lastRejection reads only what a write added: a refusal that the node's
// rate limit kept out of the log must not be explained by an older one.
func eventsSize(root p9.File, ctlPath string) int64 {
	f, err := openRead(root, eventsBeside(ctlPath))
	if err != nil {
		return 0
	}
	defer f.Close()
	size, _ := fileSize(f)
	return size
}

// openRead walks to path and opens it for reading.
func openRead(root p9.File, path string) (p9.File, error) {
	f, err := walk(root, path)
	if err != nil {
		return nil, err
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// copyFrom copies an open file from offset off to w until end of file and
// returns the offset reached.
func copyFrom(f p9.File, off int64, w io.Writer) (int64, error) {
	buf := make([]byte, 64<<10)
	for {
		n, err := f.ReadAt(buf, off)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return off, werr
			}
			off += int64(n)
		}
		if err == io.EOF || n == 0 && err == nil {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

func cat(root p9.File, path string, w io.Writer) error {
	f, err := openRead(root, path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := copyFrom(f, 0, w); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func write(root p9.File, path string, text []byte) error {
	f, err := walk(root, path)
	if err != nil {
		return err
	}
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	for len(text) > 0 {
		n, err := f.WriteAt(text, 0)
		if err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", path, err)
		}
		text = text[n:]
	}
	// A ctl line without its newline is applied at clunk, and its error
	// comes back in Rclunk.
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// tail prints the last lines of a log and then follows it by polling its
// size, as tail -f does on a file system it cannot watch. It keeps one open
// file, so that if the log's retention overtakes it, the server's per-open
// shift keeps the reads free of duplicates.
func tail(ctx context.Context, root p9.File, path string, lines int, once bool, w io.Writer) error {
	f, err := openRead(root, path)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// Read back far enough for the wanted lines: at most 256 KiB.
	start := max(size-256<<10, 0)
	var buf bytes.Buffer
	off, err := copyFrom(f, start, &buf)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	data := buf.Bytes()
	if start > 0 {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	if lines <= 0 {
		data = nil
	} else {
		data = data[lastLines(data, lines):]
	}
	if _, err := w.Write(data); err != nil || once {
		return err
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		size, err := fileSize(f)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if size > off {
			if off, err = copyFrom(f, off, w); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
	}
}

// lastLines returns the index in data where its last n lines begin.
func lastLines(data []byte, n int) int {
	end := len(data)
	if end > 0 && data[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if data[i] == '\n' {
			n--
			if n == 0 {
				return i + 1
			}
		}
	}
	return 0
}

func fileSize(f p9.File) (int64, error) {
	_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
	return int64(attr.Size), err
}
