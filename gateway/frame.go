package gateway

import (
	"bytes"
	"errors"
	"unicode/utf8"

	"github.com/shardfs/shardfs/wire"
)

// Gateway opcodes the client sends or understands. The simulator keeps its
// own copy: the two implementations share no protocol code.
const (
	opDispatch       = 0
	opHeartbeat      = 1
	opIdentify       = 2
	opResume         = 6
	opReconnect      = 7
	opInvalidSession = 9
	opHello          = 10
	opHeartbeatACK   = 11
	opGatewayError   = 12 // Fluxer: a refused voice join, informational
)

// payload is one gateway message as the node needs it: op, s and t
// decoded, d kept as raw bytes into the message buffer.
type payload struct {
	op   int
	seq  int64  // s; -1 when absent or null
	name []byte // t; nil when absent or null
	d    []byte // d as it came; nil when absent
	// nameEscaped is set when t used escapes, so name is not its value.
	nameEscaped bool
}

// strSafe marks the bytes that may appear in a JSON string unescaped and
// need no attention, for the stream splitter (objectEnd): everything from
// 0x20 up except '"' and '\'.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// parsePayload decodes the envelope of one gateway payload with the reader
// the core checks operator commands with (package wire). A payload that is
// JSON but not UTF-8 is read again from a copy with every run of invalid
// bytes replaced by U+FFFD, as encoding/json does when it decodes a
// string: such bytes can only sit inside strings, so the copy is still
// JSON, and what reaches the sink (and /dispatch) is UTF-8.
func parsePayload(b []byte) (payload, error) {
	e, err := wire.Read(b)
	if err == nil && !utf8.Valid(b) {
		e, err = wire.Read(bytes.ToValidUTF8(b, replacement))
	}
	return payload{op: e.Op, seq: e.Seq, name: e.Name, d: e.D, nameEscaped: e.NameEscaped}, err
}

var replacement = []byte(string(utf8.RuneError))

// helloInterval reads heartbeat_interval (milliseconds) from Hello's d.
func helloInterval(d []byte) (int64, error) {
	v, ok := wire.Member(d, "heartbeat_interval")
	if !ok {
		return 0, errors.New("Hello has no heartbeat_interval")
	}
	ms, ok := wire.Int(v)
	// An hour bounds a typo or a hostile server; both platforms send 41,250.
	if !ok || ms < 1 || ms > 3600_000 {
		return 0, errors.New("Hello has an invalid heartbeat_interval")
	}
	return ms, nil
}

// readyFields reads the session id and resume URL from READY's d.
func readyFields(d []byte) (session, resumeURL string) {
	if v, ok := wire.Member(d, "session_id"); ok {
		session, _ = wire.String(v)
	}
	if v, ok := wire.Member(d, "resume_gateway_url"); ok {
		resumeURL, _ = wire.String(v)
	}
	return session, resumeURL
}

// redactedSession replaces READY's session_id in what the sink sees: the
// tree must never show a session id (DESIGN.md section 4).
var redactedSession = []byte(`"redacted"`)

// redactReady returns READY's d with every session_id value replaced (a
// gateway could send the key twice). It allocates, which READY (once per
// session) can afford.
func redactReady(d []byte) []byte {
	var out []byte
	last := 0
	wire.EachMember(d, "session_id", func(start, end int) {
		out = append(out, d[last:start]...)
		out = append(out, redactedSession...)
		last = end
	})
	if out == nil {
		return d
	}
	return append(out, d[last:]...)
}
