package integration

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// traceEnv names a directory where TestV9fs writes every 9P frame of each
// mount, one line per frame: "T hex" from the kernel, "R hex" from fsrv,
// in the order they passed. That is how the kernel's exact messages get
// into fsrv/testdata transcripts.
const traceEnv = "SHARDFS_9P_TRACE"

// traced wraps a port's connection when traceEnv is set.
func traced(t *testing.T, name string, c net.Conn) net.Conn {
	dir := os.Getenv(traceEnv)
	if dir == "" {
		return c
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name+".9p"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tr := &tracer{w: f}
	return &tracedConn{Conn: c, in: frameSplitter{tr: tr, dir: "T"}, out: frameSplitter{tr: tr, dir: "R"}}
}

type tracer struct {
	mu sync.Mutex
	w  io.Writer
}

// frameSplitter cuts one direction of a stream into 9P frames.
type frameSplitter struct {
	tr  *tracer
	dir string
	buf []byte
}

func (s *frameSplitter) add(p []byte) {
	s.buf = append(s.buf, p...)
	for len(s.buf) >= 4 {
		n := int(binary.LittleEndian.Uint32(s.buf))
		if n < 7 || len(s.buf) < n {
			return
		}
		s.tr.mu.Lock()
		fmt.Fprintf(s.tr.w, "%s %s\n", s.dir, hex.EncodeToString(s.buf[:n]))
		s.tr.mu.Unlock()
		s.buf = s.buf[n:]
	}
}

type tracedConn struct {
	net.Conn
	rmu, wmu sync.Mutex
	in, out  frameSplitter
}

func (c *tracedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.rmu.Lock()
	c.in.add(p[:n])
	c.rmu.Unlock()
	return n, err
}

func (c *tracedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.wmu.Lock()
	c.out.add(p[:n])
	c.wmu.Unlock()
	return n, err
}
