package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// The private channel between the parent and a child is two socketpairs.
// The control stream carries one JSON object a line, each with its type
// in "t":
//
//	child → parent: ready {socket}, status {ready, total}, identify {id, shard, operator}, cancel {id},
//	                session {shard, sid, url, seq},
//	                limit {total, remaining, reset_after_ms, max_concurrency},
//	                written {shard, at},
//	                shard {shard, state, seq, noseq, reconnects, latency_ms}, alive
//	parent → child: grant {id, not_before}, shutdown
//
// Times (at, not_before) are wall-clock Unix nanoseconds: parent and
// children run on one host and share its clock.
//
// The data stream carries the child's dispatch log's lines
// ({"shard":...}) and its events log's lines (ts=...) as they are,
// unquoted: the parent's logs are built from them. Two streams, so that
// identify requests, state and shutdown never queue behind megabytes of
// dispatch. A line over maxMsg bytes (maxControl on the control
// stream), a line that is none of these, or an unknown type is garbage:
// the reader stops and names it.
type msg struct {
	T        string `json:"t"`
	Socket   string `json:"socket,omitempty"`
	Ready    int    `json:"ready,omitempty"`
	Total    int    `json:"total,omitempty"`
	ID       uint64 `json:"id,omitempty"`
	Shard    int    `json:"shard"`
	Operator bool   `json:"operator,omitempty"`
	// A new session of Shard (T "session"): its ID (a secret: never
	// logged), resume URL and first sequence.
	SID string `json:"sid,omitempty"`
	URL string `json:"url,omitempty"`
	Seq int64  `json:"seq,omitempty"`
	// The session start limit a child's discovery learnt (T "limit",
	// with Total).
	Remaining    int   `json:"remaining,omitempty"`
	ResetAfterMs int64 `json:"reset_after_ms,omitempty"`
	MaxConc      int   `json:"max_concurrency,omitempty"`
	// NotBefore is a grant's floor: its identify must not be written
	// before (T "grant"; zero: none). At is when an identify of Shard was
	// written (T "written"). See SpacedPacer.
	NotBefore int64 `json:"not_before,omitempty"`
	At        int64 `json:"at,omitempty"`
	// A shard's state as the child's tree would show it (T "shard"):
	// State is its word, Seq its sequence (NoSeq: none), Reconnects and
	// LatencyMs as in /status.
	State      string `json:"state,omitempty"`
	NoSeq      bool   `json:"noseq,omitempty"`
	Reconnects uint64 `json:"reconnects,omitempty"`
	LatencyMs  int64  `json:"latency_ms,omitempty"`
	// Raw is a dispatch or event line (T "dispatch" or "event"), newline
	// included; it is only valid until the next read.
	Raw []byte `json:"-"`
}

// maxMsg bounds a line: a dispatch (a large guild's GUILD_CREATE) can
// take megabytes.
const maxMsg = 16 << 20

// maxControl bounds a control line: the longest, a session, is well under
// 1 KiB (a socket path, a resume URL).
const maxControl = 4 << 10

var msgTypes = map[string]bool{"ready": true, "status": true, "identify": true, "cancel": true, "grant": true, "shutdown": true, "session": true, "limit": true, "written": true, "shard": true, "alive": true}

// ErrGarbage is wrapped by the reader's errors about what it read.
var ErrGarbage = errors.New("garbage on the private channel")

// errCutShort is the reader's error for a last line the end of the
// channel cut (it wraps ErrGarbage): a child killed in the middle of a
// write leaves one.
var errCutShort = fmt.Errorf("%w: a line cut short by the end of the channel", ErrGarbage)

var (
	dispatchPrefix = []byte(`{"shard":`)
	eventPrefix    = []byte("ts=")
)

type msgReader struct {
	r   *bufio.Reader
	max int
	buf []byte // the last line, reused: a line is valid until the next
}

// keepLine bounds the line buffer a reader keeps between lines, so that
// one huge GUILD_CREATE does not pin its size for good.
const keepLine = 256 << 10

func newMsgReader(r io.Reader) *msgReader {
	return &msgReader{r: bufio.NewReaderSize(r, 4096), max: maxMsg}
}

// newControlReader reads a control stream, whose lines are short.
func newControlReader(r io.Reader) *msgReader {
	return &msgReader{r: bufio.NewReaderSize(r, 4096), max: maxControl}
}

// next returns the next message, io.EOF at a clean end, or an error
// wrapping ErrGarbage.
func (m *msgReader) next() (msg, error) {
	line := m.buf[:0]
	defer func() {
		if cap(line) <= keepLine {
			m.buf = line[:0]
		} else {
			m.buf = nil
		}
	}()
	for {
		part, err := m.r.ReadSlice('\n')
		if len(line)+len(part) > m.max {
			return msg{}, fmt.Errorf("%w: a line over %d bytes", ErrGarbage, m.max)
		}
		line = append(line, part...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && len(line) > 0 {
			return msg{}, fmt.Errorf("%w: %q", errCutShort, clip(string(line)))
		}
		if err != nil {
			return msg{}, err
		}
		break
	}
	switch {
	case bytes.HasPrefix(line, dispatchPrefix):
		return msg{T: "dispatch", Raw: line}, nil
	case bytes.HasPrefix(line, eventPrefix):
		return msg{T: "event", Raw: line}, nil
	}
	var v msg
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || !msgTypes[v.T] {
		if bytes.Contains(line, []byte(`"sid"`)) {
			// It may hold a session ID: say what it is, not what it says.
			return msg{}, fmt.Errorf("%w: a malformed %d-byte line that names a session", ErrGarbage, len(line))
		}
		return msg{}, fmt.Errorf("%w: %q", ErrGarbage, clip(string(bytes.TrimSpace(line))))
	}
	if v.T == "written" && (v.At <= 0 || v.Shard < 0) {
		return msg{}, fmt.Errorf("%w: a written message without its shard or time: %q", ErrGarbage, clip(string(bytes.TrimSpace(line))))
	}
	return v, nil
}

type msgWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

// raw writes whole lines as they are.
func (m *msgWriter) raw(b []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		_, m.err = m.w.Write(b)
	}
	return m.err
}

// send writes m; after a failure it keeps returning that error.
func (m *msgWriter) send(v msg) error {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil {
		_, m.err = m.w.Write(b)
	}
	return m.err
}
