package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// ReadFile returns the whole content of the file at path.
func (c *Client) ReadFile(path string) ([]byte, error) {
	var b bytes.Buffer
	err := c.Copy(&b, path)
	return b.Bytes(), err
}

// Copy writes the content of the file at path to w as it reads it, for
// logs too large to hold in memory.
func (c *Client) Copy(w io.Writer, path string) error {
	f, err := c.openRead(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := copyFrom(f, 0, w); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// RefusedError is a ctl command the tree refused, with the reason: 9P2000.L
// carries only an errno, so the client reads the reason from the events
// log beside the ctl file.
type RefusedError struct {
	Err    error  // the write's error, such as "0/ctl: invalid argument"
	Reason string // the node's "event=rejected" line for the command
}

func (e *RefusedError) Error() string { return e.Err.Error() + "\n" + e.Reason }
func (e *RefusedError) Unwrap() error { return e.Err }

// WriteFile writes data to the file at path in one open, at offset 0 (the
// tree's ctl and send files take whole commands, one a line). A ctl
// command without its final newline is applied when the file is closed,
// and its refusal still comes back. When the tree refuses a command
// written to a ctl file, the error is a *RefusedError that carries the
// node's reason; a write the listener does not allow (EACCES) is not a
// refused command and comes back as it is.
func (c *Client) WriteFile(path string, data []byte) error {
	isCtl := strings.HasSuffix(strings.TrimSuffix(path, "/"), "ctl")
	var since int64
	if isCtl {
		since = c.eventsSize(path)
	}
	var err error
	if isCtl {
		err = c.writeLines(path, data)
	} else {
		err = c.write(path, data)
	}
	if err != nil && isCtl && !errors.Is(err, linux.EACCES) {
		if why := c.lastRejection(path, since); why != "" {
			return &RefusedError{Err: err, Reason: why}
		}
	}
	return err
}

// MaxCtlLine is the longest ctl command line WriteFile sends: each write
// to a ctl file carries whole lines and fits in one message of any msize
// a server negotiates in practice, so that the 9P library never cuts a
// line where the server would take its first part for a whole command
// ("stop 10" cut at 65,024 bytes ran "stop 1").
const MaxCtlLine = 4000

// ErrCtlLineTooLong refuses, before anything is sent, a ctl text with a
// line longer than MaxCtlLine.
var ErrCtlLineTooLong = errors.New("ctl line too long")

// writeLines writes text to the ctl file path in writes of whole lines of
// at most MaxCtlLine bytes together (or one line and its newline).
func (c *Client) writeLines(path string, text []byte) error {
	for rest, n := text, 1; len(rest) > 0; n++ {
		line, after, _ := bytes.Cut(rest, []byte("\n"))
		if len(line) > MaxCtlLine {
			return fmt.Errorf("%s: %w: line %d has %d bytes, the limit is %d; nothing was sent", path, ErrCtlLineTooLong, n, len(line), MaxCtlLine)
		}
		rest = after
	}
	var writes [][]byte
	for len(text) > 0 {
		end := 0
		for end < len(text) {
			i := bytes.IndexByte(text[end:], '\n')
			next := len(text)
			if i >= 0 {
				next = end + i + 1
			}
			if end > 0 && next > MaxCtlLine {
				break
			}
			end = next
		}
		writes = append(writes, text[:end])
		text = text[end:]
	}
	return c.writeEach(path, writes)
}

func (c *Client) write(path string, text []byte) error {
	return c.writeEach(path, [][]byte{text})
}

// writeEach opens path for writing, writes each of writes in turn (a
// short count is resent from there) and clunks it.
func (c *Client) writeEach(path string, writes [][]byte) error {
	f, err := c.walk(path)
	if err != nil {
		return err
	}
	if _, _, err := f.Open(p9.WriteOnly); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	// A short count is the bytes a ctl applied before a bad line; the
	// resend starts at that line and returns its error.
	for _, text := range writes {
		for len(text) > 0 {
			n, err := f.WriteAt(text, 0)
			if err != nil {
				f.Close()
				return fmt.Errorf("%s: %w", path, err)
			}
			text = text[n:]
		}
	}
	// A ctl line left without its newline by a write of a multiple of
	// 4 KiB is applied at clunk, and its error comes back in Rclunk.
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// lastRejection returns the newest "event=rejected" line that the events
// log beside a ctl file gained after offset since, or "".
func (c *Client) lastRejection(ctlPath string, since int64) string {
	f, err := c.openRead(eventsBeside(ctlPath))
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
func (c *Client) eventsSize(ctlPath string) int64 {
	f, err := c.openRead(eventsBeside(ctlPath))
	if err != nil {
		return 0
	}
	defer f.Close()
	size, _ := fileSize(f)
	return size
}

// Stat describes the file or directory at path. Its Mode holds the
// permissions the server shows, with fs.ModeDir for a directory.
func (c *Client) Stat(path string) (fs.FileInfo, error) {
	f, err := c.walk(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	qid, _, attr, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	name := path
	if i := strings.LastIndexByte(strings.TrimSuffix(path, "/"), '/'); i >= 0 {
		name = strings.TrimSuffix(path[i+1:], "/")
	}
	return fileInfo{name: name, dir: qid.Type&p9.TypeDir != 0, attr: attr}, nil
}

type fileInfo struct {
	name string
	dir  bool
	attr p9.Attr
}

func (i fileInfo) Name() string { return i.name }
func (i fileInfo) Size() int64  { return int64(i.attr.Size) }
func (i fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.attr.Mode.Permissions())
	if i.dir {
		m |= fs.ModeDir
	}
	return m
}
func (i fileInfo) ModTime() time.Time {
	return time.Unix(int64(i.attr.MTimeSeconds), int64(i.attr.MTimeNanoSeconds))
}
func (i fileInfo) IsDir() bool { return i.dir }
func (i fileInfo) Sys() any    { return i.attr }

// Entry is a name in a directory of the tree.
type Entry struct {
	Name string
	Dir  bool
}

// List returns the entries of the directory at path ("" and "/" are the
// root) in the server's order, without "." and "..".
func (c *Client) List(path string) ([]Entry, error) {
	f, err := c.openRead(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Entry
	for off := uint64(0); ; {
		ents, err := f.Readdir(off, 1024)
		if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		if len(ents) == 0 {
			return out, nil
		}
		for _, e := range ents {
			if e.Name == "." || e.Name == ".." {
				continue
			}
			out = append(out, Entry{Name: e.Name, Dir: e.QID.Type&p9.TypeDir != 0})
		}
		off = ents[len(ents)-1].Offset
	}
}

// LastLines returns the last n lines of the log at path, as tail -n does.
func (c *Client) LastLines(path string, n int) ([]byte, error) {
	f, err := c.openRead(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, _, err := readLast(f, path, n)
	return data, err
}

// Tail writes the last lines of the log at path to w and then what the
// log gains, as tail -f does, until ctx ends; it returns nil then. It
// finds new lines by asking the log's size twice a second, since 9P
// cannot watch a file. It keeps one open file, so that if the log's
// retention overtakes it, the server's per-open shift keeps the reads
// free of duplicates.
func (c *Client) Tail(ctx context.Context, path string, lines int, w io.Writer) error {
	f, err := c.openRead(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, off, err := readLast(f, path, lines)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	tick := time.NewTicker(c.poll)
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

// readLast returns the last n lines of an open log and the offset where
// its reading stopped.
func readLast(f p9.File, path string, n int) ([]byte, int64, error) {
	size, err := fileSize(f)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	// Read back far enough for the wanted lines: at most 256 KiB.
	start := max(size-256<<10, 0)
	var buf bytes.Buffer
	off, err := copyFrom(f, start, &buf)
	if err != nil {
		return nil, off, fmt.Errorf("%s: %w", path, err)
	}
	data := buf.Bytes()
	if start > 0 {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	if n <= 0 {
		return nil, off, nil
	}
	return data[lastLines(data, n):], off, nil
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

func fileSize(f p9.File) (int64, error) {
	_, _, attr, err := f.GetAttr(p9.AttrMask{Size: true})
	return int64(attr.Size), err
}
