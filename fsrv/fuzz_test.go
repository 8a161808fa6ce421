package fsrv

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// transcriptFrames encodes the T-lines of the transcripts of one dialect,
// one session per file, as seeds for the fuzzers.
func transcriptFrames(t testing.TB, dotl bool) [][]byte {
	prefix := "9p-"
	if dotl {
		prefix = "dotl-"
	}
	files, err := filepath.Glob(filepath.Join("testdata", prefix+"*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s transcripts: %v", prefix, err)
	}
	var out [][]byte
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var session []byte
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "T") {
				continue
			}
			line, err := expandPad(line)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			var frame []byte
			if dotl {
				m, err := parseDotL(line)
				if err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				frame, err = encodeDotL(m)
				if err != nil {
					t.Fatalf("%s: %v", file, err)
				}
			} else {
				f, err := parsePlan9(line)
				if err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				frame, _ = f.Bytes()
			}
			session = append(session, frame...)
		}
		out = append(out, session)
	}
	return out
}

// FuzzSniff feeds arbitrary first messages to the version negotiation.
func FuzzSniff(f *testing.F) {
	for _, v := range []string{"9P2000.L", "9P2000.L.Google.7", "9P2000", "9P2000.u", "9P1999", ""} {
		f.Add(versionFrame(msgTversion, noTag, 8192, v))
	}
	f.Add(versionFrame(msgTversion, noTag, 10, "9P2000.L"))
	f.Add(append(versionFrame(msgTversion, 1, 8192, "x"), versionFrame(msgTversion, 2, 1<<30, "9P2000")...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 100})
	for _, s := range transcriptFrames(f, false) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		neg, err := sniff(bytes.NewReader(data), &out, 64<<10)
		if err != nil {
			return
		}
		v, err := parseVersion(neg.first)
		if err != nil {
			t.Fatalf("sniff passed on a Tversion it cannot parse: %v", err)
		}
		if v.msize < MinMsize || v.msize > 64<<10 || v.msize != neg.msize {
			t.Fatalf("sniff passed msize %d (negotiated %d); want %d..%d", v.msize, neg.msize, MinMsize, 64<<10)
		}
		if neg.dialect != dialectOf(v.version) || neg.dialect == dialectUnknown {
			t.Fatalf("sniff chose dialect %d for %q", neg.dialect, v.version)
		}
	})
}

// fuzzSession serves one connection that receives prefix and then data,
// and checks that the server survives it and lets go of the connection.
func fuzzSession(t *testing.T, prefix, data []byte) {
	fx := newFixture()
	srv := &Server{Root: fx.root, Clock: fx.clock, MaxMsize: 64 << 10}
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(context.Background(), server)
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		io.Copy(io.Discard, client)
	}()
	client.Write(prefix)
	client.Write(data)
	client.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("ServeConn did not return after the client hung up; input %x", data)
	}
	<-drained
}

var (
	dotlPrefix = append(versionFrame(msgTversion, noTag, 8192, "9P2000.L"),
		mustEncodeDotL("Tattach tag 1 fid 1 afid NOFID uname root aname '' nuname 0")...)
	plan9Prefix = append(versionFrame(msgTversion, noTag, 8192, "9P2000"),
		mustEncodePlan9("Tattach tag 1 fid 1 afid NOFID uname glenda aname ''")...)
)

func mustEncodeDotL(line string) []byte {
	m, err := parseDotL(line)
	if err != nil {
		panic(err)
	}
	b, err := encodeDotL(m)
	if err != nil {
		panic(err)
	}
	return b
}

func mustEncodePlan9(line string) []byte {
	f, err := parsePlan9(line)
	if err != nil {
		panic(err)
	}
	b, err := f.Bytes()
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzDotL feeds arbitrary frames to an attached 9P2000.L session.
func FuzzDotL(f *testing.F) {
	for _, s := range transcriptFrames(f, true) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { fuzzSession(t, dotlPrefix, data) })
}

// FuzzPlan9 feeds arbitrary frames to an attached 9P2000 session.
func FuzzPlan9(f *testing.F) {
	for _, s := range transcriptFrames(f, false) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { fuzzSession(t, plan9Prefix, data) })
}
