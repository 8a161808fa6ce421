package relay

import (
	"bytes"
	"strconv"
)

// event is one line of a shard's dispatch journal:
// {"shard":N,"s":SEQ,"t":"TYPE","session":KEY,"d":...}, as
// shardfs.Tree.Dispatch writes it (KEY a string or null; a line without
// the session key, as written before it existed, parses too). t and d
// alias the line.
type event struct {
	seq int64 // -1 for null
	t   []byte
	d   []byte
}

// parseLine takes the line apart without decoding d: the tree writes the
// keys in a fixed order, a type is a plain word, and d runs to the
// closing brace before the newline.
func parseLine(line []byte) (event, bool) {
	var e event
	line = bytes.TrimSuffix(line, []byte("\n"))
	i := bytes.Index(line, []byte(`,"s":`))
	if i < 0 {
		return e, false
	}
	rest := line[i+5:]
	j := bytes.Index(rest, []byte(`,"t":"`))
	if j < 0 {
		return e, false
	}
	if s := rest[:j]; string(s) == "null" {
		e.seq = -1
	} else {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return e, false
		}
		e.seq = n
	}
	rest = rest[j+6:]
	k := bytes.IndexByte(rest, '"')
	if k < 0 {
		return e, false
	}
	e.t, rest = rest[:k], rest[k+1:]
	if after, ok := bytes.CutPrefix(rest, []byte(`,"session":`)); ok {
		// null or a quoted hex digest: no comma inside either.
		c := bytes.IndexByte(after, ',')
		if c < 0 {
			return e, false
		}
		rest = after[c:]
	}
	d, ok := bytes.CutPrefix(rest, []byte(`,"d":`))
	if !ok || len(d) < 2 || d[len(d)-1] != '}' {
		return e, false
	}
	e.d = d[:len(d)-1]
	return e, true
}

// lineReader reads whole lines of a journal from an offset.
type lineReader struct {
	off int64
	buf []byte
}

// source is what lineReader reads: a journal.Log.
type source interface {
	ReadAt(p []byte, off int64) (n int, start int64)
}

// next returns the whole lines retained from r.off on (aliasing r's
// buffer until the next call) and whether lines were dropped before them
// (the journal's retention passed r.off).
func (r *lineReader) next(src source) (lines []byte, lost bool) {
	if r.buf == nil {
		r.buf = make([]byte, 64<<10)
	}
	for {
		n, start := src.ReadAt(r.buf, r.off)
		if n == 0 {
			return nil, false
		}
		lost = lost || start > r.off
		end := bytes.LastIndexByte(r.buf[:n], '\n')
		if end < 0 {
			// One line longer than the buffer.
			r.buf = make([]byte, 2*len(r.buf))
			r.off = start
			continue
		}
		r.off = start + int64(end+1)
		return r.buf[:end+1], lost
	}
}

// eachLine calls f for each line of p, newline included.
func eachLine(p []byte, f func(line []byte)) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return
		}
		f(p[:i+1])
		p = p[i+1:]
	}
}
