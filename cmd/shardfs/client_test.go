package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hugelgupf/p9/p9"

	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
)

// hugelgupfRoot, hugelgupfRead and hugelgupfWrite use hugelgupf/p9's
// client as a program with the 9P library alone would: the foreign-client
// test's point. Every other test goes through the client package.
func hugelgupfRoot(t *testing.T, hostPort string) p9.File {
	t.Helper()
	conn, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := p9.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	root, err := cl.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func hugelgupfRead(root p9.File, path string) (string, error) {
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		return "", err
	}
	buf := make([]byte, 64<<10)
	n, err := f.ReadAt(buf, 0)
	if err == io.EOF {
		err = nil
	}
	return string(buf[:n]), err
}

func hugelgupfWrite(root p9.File, path, text string) error {
	_, f, err := root.Walk(strings.Split(path, "/"))
	if err != nil {
		return err
	}
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteAt([]byte(text), 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// serveDemo serves a one-shard demo on a unix socket in a temporary
// folder until the test ends and returns its address.
func serveDemo(t *testing.T) string {
	t.Helper()
	d, err := demo.Start(context.Background(), demo.Config{Shards: 1, Traffic: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := "unix!" + filepath.Join(t.TempDir(), "demo.sock")
	l, err := fsrv.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		<-served
		d.Close()
	})
	return addr
}

// shardfsCmd runs the command line in the test process and returns its
// standard output and error together.
func shardfsCmd(args ...string) (string, error) {
	var out, errb strings.Builder
	err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return out.String() + errb.String(), err
}

// ls without a PATH lists the root, as ls(1) lists the current folder;
// with one it lists that directory, or describes that file.
func TestLsRoot(t *testing.T) {
	addr := serveDemo(t)
	for _, tc := range []struct {
		args []string
		want []string // lines the output holds
	}{
		{nil, []string{"0/\n", "status\n", "ctl\n", "events\n"}},
		{[]string{"/"}, []string{"0/\n", "status\n"}},
		{[]string{"0"}, []string{"state\n", "ctl\n"}},
		{[]string{"0/state"}, []string{"-r--r--r-- ", " 0/state\n"}},
	} {
		out, err := shardfsCmd(append([]string{"ls", "--addr", addr}, tc.args...)...)
		if err != nil {
			t.Errorf("shardfs ls %q = %v, %q", tc.args, err, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("shardfs ls %q printed %q; want a line %q", tc.args, out, w)
			}
		}
	}
}

// A client that reaches no tree names every address it tried, each with
// its own error: without --addr the node's unix socket, then loopback
// TCP.
func TestClientNamesEveryAddressTried(t *testing.T) {
	for _, addr := range []string{fsrv.DefaultSocket(), "127.0.0.1:5640"} {
		network := "unix"
		if !strings.HasPrefix(addr, "/") {
			network = "tcp"
		}
		if c, err := net.Dial(network, addr); err == nil {
			c.Close()
			t.Skipf("something listens on the default address %s on this machine", addr)
		}
	}
	out, err := shardfsCmd("cat", "status")
	for _, want := range []string{"\n\tunix!" + fsrv.DefaultSocket() + ": ", "\n\ttcp!127.0.0.1!5640: "} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("shardfs cat status with no tree = %v, %q; want an error with a line %q", err, out, want)
		}
	}
}
