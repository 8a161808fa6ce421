package fsrv

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"9fans.net/go/plan9"
)

// TestTranscript replays testdata/*.txt in the style of srv9p's
// transcript tests: T-lines are sent, and each run of R-lines must match
// the replies that come back (in any order within the run). Files named
// dotl-*.txt speak 9P2000.L (the codec in dotlcodec_test.go), files named
// 9p-*.txt speak 9P2000 (9fans.net/go/plan9.ParseFcall).
//
// QID paths come from a process-wide counter, so the runner renames them
// in replies: the first path seen becomes 0x1, the next 0x2, and so on.
// Data may be written as a Go quoted string ("stop\nstart\n"), and as
// pad N "text": N bytes that end in text, newlines before it, the way a
// client's cut of a long write at N bytes ends in the start of a line.
//
// Other verbs act on the fixture (fixture_test.go):
//
//	serve               start a server on the fixture and connect to it
//	append "text"       append to the events log
//	fill N              append N lines of 10 bytes to the events log
//	status "text"       set the content of /status
//	advance 1s          advance the fixture's clock
//	handled "a" "b"     the ctl lines handled since the last check
//	hangup              the server must close the connection
//	raw HEX             send these bytes (spaces ignored), for messages
//	                    the parsers cannot write
func TestTranscript(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			dotl := strings.HasPrefix(filepath.Base(file), "dotl-")
			runTranscript(t, file, string(data), dotl)
		})
	}
}

// transcript is the state of one replay.
type transcript struct {
	t     *testing.T
	dotl  bool
	fx    *fixture
	conn  *net.UnixConn
	paths map[uint64]uint64
	// hungUp is set when the script expects the server to drop the
	// connection.
	hungUp bool
}

func (tr *transcript) norm(p uint64) uint64 {
	if n, ok := tr.paths[p]; ok {
		return n
	}
	n := uint64(len(tr.paths) + 1)
	tr.paths[p] = n
	return n
}

var quotedData = regexp.MustCompile(`data ("(?:[^"\\]|\\.)*")`)

func runTranscript(t *testing.T, file, script string, dotl bool) {
	tr := &transcript{t: t, dotl: dotl, paths: map[uint64]uint64{}}
	lines := strings.Split(script, "\n")
	for i := 0; i < len(lines); i++ {
		pos := fmt.Sprintf("%s:%d", file, i+1)
		line := strings.TrimSpace(lines[i])
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		verb, rest, _ := strings.Cut(line, " ")
		switch {
		case verb == "serve":
			tr.serve(pos)
		case verb == "append":
			s, err := strconv.Unquote(rest)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			tr.fx.appendEvent(s)
		case verb == "fill":
			n, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			for k := range n {
				tr.fx.appendEvent(fmt.Sprintf("event %03d\n", k))
			}
		case verb == "status":
			s, err := strconv.Unquote(rest)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			tr.fx.setStatus(s)
		case verb == "advance":
			d, err := time.ParseDuration(rest)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			tr.fx.clock.Advance(d)
		case verb == "handled":
			toks, err := tokens(rest)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			var want []string
			for _, tok := range toks {
				s, err := unquote(tok)
				if err != nil {
					t.Fatalf("%s: %v", pos, err)
				}
				want = append(want, s)
			}
			if got := tr.fx.takeHandled(); !slices.Equal(got, want) {
				t.Fatalf("%s: handled = %q; want %q", pos, got, want)
			}
		case verb == "hangup":
			tr.expectHangup(pos)
		case verb == "raw":
			b, err := hex.DecodeString(strings.ReplaceAll(rest, " ", ""))
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			if _, err := tr.conn.Write(b); err != nil {
				t.Fatalf("%s: write: %v", pos, err)
			}
		case verb[0] == 'T':
			tr.send(pos, line)
		case verb[0] == 'R':
			var want []string
			for ; i < len(lines) && strings.HasPrefix(lines[i], "R"); i++ {
				want = append(want, strings.TrimSpace(lines[i]))
			}
			i--
			tr.expect(pos, want)
		default:
			t.Fatalf("%s: unknown verb %q", pos, verb)
		}
	}
	if tr.conn != nil && !tr.hungUp {
		// The script is over: no reply may be left unread.
		tr.conn.CloseWrite()
		tr.expectHangup(fmt.Sprintf("%s:end", file))
	}
}

func (tr *transcript) serve(pos string) {
	t := tr.t
	if tr.fx != nil {
		t.Fatalf("%s: already serving", pos)
	}
	tr.fx = newFixture()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client, server := conn(fds[0]), conn(fds[1])
	tr.conn = client.(*net.UnixConn)
	srv := tr.fx.server(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(context.Background(), server)
	}()
	t.Cleanup(func() {
		client.Close()
		<-done
	})
}

func (tr *transcript) send(pos, line string) {
	t := tr.t
	if tr.conn == nil {
		t.Fatalf("%s: not serving", pos)
	}
	line, err := expandPad(line)
	if err != nil {
		t.Fatalf("%s: %v", pos, err)
	}
	var msg []byte
	if tr.dotl {
		m, err := parseDotL(line)
		if err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
		if msg, err = encodeDotL(m); err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
	} else {
		f, err := parsePlan9(line)
		if err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
		if msg, err = f.Bytes(); err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
	}
	if _, err := tr.conn.Write(msg); err != nil {
		t.Fatalf("%s: write: %v", pos, err)
	}
}

var padData = regexp.MustCompile(`data pad ([0-9]+) ("(?:[^"\\]|\\.)*")`)

// expandPad replaces data pad N "text" with the quoted data it stands for.
func expandPad(line string) (string, error) {
	var err error
	line = padData.ReplaceAllStringFunc(line, func(m string) string {
		sub := padData.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[1])
		text, e := strconv.Unquote(sub[2])
		if e == nil && len(text) > n {
			e = fmt.Errorf("pad %d: %q is longer", n, text)
		}
		if e != nil {
			err = e
			return m
		}
		return "data " + strconv.Quote(strings.Repeat("\n", n-len(text))+text)
	})
	return line, err
}

// parsePlan9 is plan9.ParseFcall with Go quoted data.
func parsePlan9(line string) (*plan9.Fcall, error) {
	var err error
	line = quotedData.ReplaceAllStringFunc(line, func(m string) string {
		s, e := strconv.Unquote(strings.TrimPrefix(m, "data "))
		if e != nil {
			err = e
		}
		if s == "" {
			return "data ''"
		}
		return "data " + hex.EncodeToString([]byte(s))
	})
	if err != nil {
		return nil, err
	}
	return plan9.ParseFcall(line)
}

// readReply reads one reply frame with a bound, so that a missing reply
// fails the test instead of hanging it.
func (tr *transcript) readReply() ([]byte, error) {
	tr.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer tr.conn.SetReadDeadline(time.Time{})
	return readFrame(tr.conn, 1<<24)
}

func (tr *transcript) expect(pos string, want []string) {
	t := tr.t
	if tr.conn == nil {
		t.Fatalf("%s: not serving", pos)
	}
	var extra []string
	left := slices.Clone(want)
Read:
	for range want {
		frame, err := tr.readReply()
		if err != nil {
			t.Fatalf("%s: reading reply: %v", pos, err)
		}
		got, ok := tr.matchAny(pos, frame, left)
		if ok >= 0 {
			left[ok] = ""
			continue Read
		}
		extra = append(extra, got)
	}
	if len(extra) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: reply mismatch:\nhave:", pos)
	for _, e := range extra {
		fmt.Fprintf(&b, "\n\t%s", e)
	}
	b.WriteString("\nwant:")
	for _, w := range left {
		if w != "" {
			fmt.Fprintf(&b, "\n\t%s", w)
		}
	}
	t.Fatal(b.String())
}

// matchAny compares a reply with the expected lines not yet matched; it
// returns the reply as text and the index of the line it matched, or -1.
func (tr *transcript) matchAny(pos string, frame []byte, want []string) (string, int) {
	t := tr.t
	if tr.dotl {
		got, err := decodeDotL(frame, tr.norm)
		if err != nil {
			return fmt.Sprintf("undecodable %x: %v", frame, err), -1
		}
		for i, w := range want {
			if w == "" {
				continue
			}
			m, err := parseDotL(w)
			if err != nil {
				t.Fatalf("%s: %v", pos, err)
			}
			if dotlMatches(got, m) {
				return got.String(), i
			}
		}
		return got.String(), -1
	}
	got, err := plan9.UnmarshalFcall(frame)
	if err != nil {
		return fmt.Sprintf("undecodable %x: %v", frame, err), -1
	}
	tr.normPlan9(got)
	gotBytes, _ := got.Bytes()
	for i, w := range want {
		if w == "" {
			continue
		}
		f, err := parsePlan9(w)
		if err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
		b, err := f.Bytes()
		if err != nil {
			t.Fatalf("%s: %v", pos, err)
		}
		if bytes.Equal(b, gotBytes) {
			return got.String(), i
		}
	}
	return got.String(), -1
}

// dotlMatches compares the type, the tag and the fields the expected line
// names; fields it leaves out are not compared.
func dotlMatches(got, want *dotlMsg) bool {
	if got.typ != want.typ || got.tag != want.tag {
		return false
	}
	for _, f := range want.order {
		if got.fields[f] != want.fields[f] {
			return false
		}
	}
	return true
}

func (tr *transcript) normPlan9(f *plan9.Fcall) {
	switch f.Type {
	case plan9.Rattach, plan9.Ropen, plan9.Rcreate:
		f.Qid.Path = tr.norm(f.Qid.Path)
	}
	for i := range f.Wqid {
		f.Wqid[i].Path = tr.norm(f.Wqid[i].Path)
	}
	normDir := func(b []byte) []byte {
		d, err := plan9.UnmarshalDir(b)
		if err != nil {
			return b
		}
		d.Qid.Path = tr.norm(d.Qid.Path)
		nb, _ := d.Bytes()
		return nb
	}
	switch f.Type {
	case plan9.Rstat:
		f.Stat = normDir(f.Stat)
	case plan9.Rread:
		// A directory read is a run of stats; other data is left alone.
		var out []byte
		b := f.Data
		for len(b) >= 2 {
			n := int(b[0]) | int(b[1])<<8 + 2
			if n > len(b) {
				return
			}
			if _, err := plan9.UnmarshalDir(b[:n]); err != nil {
				return
			}
			out = append(out, b[:n]...)
			b = b[n:]
		}
		if len(b) != 0 || len(out) == 0 {
			return
		}
		var norm []byte
		for b = out; len(b) > 0; {
			n := int(b[0]) | int(b[1])<<8 + 2
			norm = append(norm, normDir(b[:n])...)
			b = b[n:]
		}
		f.Data = norm
	}
}

// expectHangup waits for the server to close the connection, failing if a
// reply comes instead.
func (tr *transcript) expectHangup(pos string) {
	t := tr.t
	frame, err := tr.readReply()
	switch {
	case err == nil:
		got := fmt.Sprintf("%x", frame)
		if tr.dotl {
			if m, err := decodeDotL(frame, tr.norm); err == nil {
				got = m.String()
			}
		} else if f, err := plan9.UnmarshalFcall(frame); err == nil {
			got = f.String()
		}
		t.Fatalf("%s: unexpected reply %s; want the connection closed", pos, got)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		tr.hungUp = true
	default:
		t.Fatalf("%s: %v; want the connection closed", pos, err)
	}
}
