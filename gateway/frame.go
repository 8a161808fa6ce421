package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// maxDepth bounds the nesting of a payload, as encoding/json does, so that a
// hostile payload of ten million '[' cannot exhaust memory in the scanner.
const maxDepth = 10000

// payload is one gateway message as the supervisor needs it: op, s and t
// decoded, d kept as raw bytes into the message buffer.
type payload struct {
	op   int
	seq  int64  // s; -1 when absent or null
	name []byte // t; nil when absent or null
	d    []byte // d as it came; nil when absent
	// nameEscaped is set when t used escapes, so name is not its value.
	nameEscaped bool
}

var (
	errNotObject = errors.New("payload is not a JSON object")
	errNoOp      = errors.New("payload has no integer op")
	errSyntax    = errors.New("invalid JSON")
)

// syntaxError says where a payload stopped being JSON, without quoting it:
// payloads may carry anything, and errors end up in event logs.
func syntaxError(what string, at int) error {
	return fmt.Errorf("%w: %s at byte %d", errSyntax, what, at)
}

// parsePayload decodes the envelope of one gateway payload. The whole
// message is validated as strict JSON (what encoding/json.Valid accepts),
// but only op, s and t are decoded; d stays raw.
func parsePayload(b []byte) (payload, error) {
	p := payload{op: -1, seq: -1}
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return p, errNotObject
	}
	hasOp := false
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return p, syntaxError("expected a key", i)
			}
			ks := i
			end, escaped, err := skipString(b, i)
			if err != nil {
				return p, err
			}
			key := b[ks+1 : end-1]
			if escaped {
				key = unescapeKey(b[ks:end])
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return p, syntaxError("expected ':'", i)
			}
			i = skipWS(b, i+1)
			vs := i
			ve, err := skipValue(b, i, 1)
			if err != nil {
				return p, err
			}
			v := b[vs:ve]
			switch string(key) {
			case "op":
				op, ok := parseInt(v)
				if !ok || op < -1<<31 || op >= 1<<31 {
					return p, errNoOp
				}
				p.op, hasOp = int(op), true
			case "s":
				switch {
				case isNull(v):
					p.seq = -1
				default:
					s, ok := parseInt(v)
					if !ok || s < 0 {
						return p, fmt.Errorf("%w: s is not a sequence", errSyntax)
					}
					p.seq = s
				}
			case "t":
				switch {
				case isNull(v):
					p.name, p.nameEscaped = nil, false
				case v[0] == '"':
					p.name = v[1 : len(v)-1]
					_, p.nameEscaped, _ = skipString(v, 0)
				default:
					return p, fmt.Errorf("%w: t is not a string", errSyntax)
				}
			case "d":
				p.d = v
			}
			i = skipWS(b, ve)
			if i < len(b) && b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			return p, syntaxError("expected ',' or '}'", i)
		}
	}
	if i = skipWS(b, i); i != len(b) {
		return p, syntaxError("data after the payload", i)
	}
	if !hasOp {
		return p, errNoOp
	}
	return p, nil
}

// unescapeKey decodes a key that used escapes. Keys the client looks for
// never need them, so this slow path only keeps "\u006fp" meaning "op".
func unescapeKey(quoted []byte) []byte {
	var s string
	if json.Unmarshal(quoted, &s) != nil {
		return nil
	}
	return []byte(s)
}

func isNull(v []byte) bool { return len(v) == 4 && string(v) == "null" }

// parseInt reads a JSON number that is an integer (no fraction, no
// exponent) into an int64.
func parseInt(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 20 {
		return 0, false
	}
	for i, c := range v {
		if !(c >= '0' && c <= '9' || c == '-' && i == 0) {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// jsonString decodes a JSON string value; ok is false for anything else.
func jsonString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if _, esc, err := skipString(v, 0); err == nil && !esc {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// member returns the raw value of key in the JSON object obj, which must
// already be valid JSON; of several, the last, as encoding/json does.
func member(obj []byte, key string) (v []byte, ok bool) {
	eachMember(obj, key, func(start, end int) { v, ok = obj[start:end], true })
	return v, ok
}

// eachMember calls fn with the span of every value of key in the JSON
// object obj, in order, so that READY can be redacted in place.
func eachMember(obj []byte, key string, fn func(start, end int)) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i = skipWS(obj, i+1)
	for i < len(obj) && obj[i] == '"' {
		end, escaped, err := skipString(obj, i)
		if err != nil {
			return
		}
		k := obj[i+1 : end-1]
		if escaped {
			k = unescapeKey(obj[i:end])
		}
		i = skipWS(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipWS(obj, i+1)
		ve, err := skipValue(obj, i, 1)
		if err != nil {
			return
		}
		if string(k) == key {
			fn(i, ve)
		}
		i = skipWS(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i = skipWS(obj, i+1)
		}
	}
}

// helloInterval reads heartbeat_interval (milliseconds) from Hello's d.
func helloInterval(d []byte) (int64, error) {
	v, ok := member(d, "heartbeat_interval")
	if !ok {
		return 0, errors.New("Hello has no heartbeat_interval")
	}
	ms, ok := parseInt(v)
	// An hour bounds a typo or a hostile server; both platforms send 41,250.
	if !ok || ms < 1 || ms > 3600_000 {
		return 0, errors.New("Hello has an invalid heartbeat_interval")
	}
	return ms, nil
}

// readyFields reads the session id and resume URL from READY's d.
func readyFields(d []byte) (session, resumeURL string) {
	if v, ok := member(d, "session_id"); ok {
		session, _ = jsonString(v)
	}
	if v, ok := member(d, "resume_gateway_url"); ok {
		resumeURL, _ = jsonString(v)
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
	eachMember(d, "session_id", func(start, end int) {
		out = append(out, d[last:start]...)
		out = append(out, redactedSession...)
		last = end
	})
	if out == nil {
		return d
	}
	return append(out, d[last:]...)
}

// strSafe marks the bytes that may appear in a JSON string unescaped and
// need no attention: everything from 0x20 up except '"' and '\'.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString checks the JSON string starting at b[i] == '"' and returns the
// index after its closing quote, and whether it used escapes.
func skipString(b []byte, i int) (end int, escaped bool, err error) {
	j := i + 1
	for {
		for j < len(b) && strSafe[b[j]] {
			j++
		}
		if j >= len(b) {
			return 0, false, syntaxError("unterminated string", i)
		}
		switch b[j] {
		case '"':
			return j + 1, escaped, nil
		case '\\':
			escaped = true
			if j+1 >= len(b) {
				return 0, false, syntaxError("unterminated escape", j)
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return 0, false, syntaxError("invalid \\u escape", j)
				}
				j += 6
			default:
				return 0, false, syntaxError("invalid escape", j)
			}
		default:
			return 0, false, syntaxError("control character in string", j)
		}
	}
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// skipNumber checks the JSON number at b[i] and returns the index after it.
func skipNumber(b []byte, i int) (int, error) {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return 0, syntaxError("invalid number", start)
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return 0, syntaxError("invalid number", start)
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return 0, syntaxError("invalid number", start)
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, nil
}

func skipLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, syntaxError("invalid literal", i)
	}
	return i + len(lit), nil
}

// skipValue checks the JSON value starting at b[i] (no leading whitespace),
// nested inside outer containers, and returns the index after it. It is
// iterative, with an explicit stack of open containers; like encoding/json
// it refuses more than maxDepth levels in all.
func skipValue(b []byte, i, outer int) (int, error) {
	var stackBuf [64]byte
	stack := stackBuf[:0] // '{' or '[' per open container
	var err error
	for {
		// A value starts at i.
		if i >= len(b) {
			return 0, syntaxError("unexpected end", i)
		}
		opened := false
		switch c := b[i]; {
		case c == '{':
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			if outer+len(stack) >= maxDepth {
				return 0, syntaxError("nesting too deep", i)
			}
			stack = append(stack, '{')
			if i, err = skipKey(b, i); err != nil {
				return 0, err
			}
			opened = true
		case c == '[':
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			if outer+len(stack) >= maxDepth {
				return 0, syntaxError("nesting too deep", i)
			}
			stack = append(stack, '[')
			opened = true
		case c == '"':
			if i, _, err = skipString(b, i); err != nil {
				return 0, err
			}
		case c == '-' || isDigit(c):
			if i, err = skipNumber(b, i); err != nil {
				return 0, err
			}
		case c == 't':
			if i, err = skipLiteral(b, i, "true"); err != nil {
				return 0, err
			}
		case c == 'f':
			if i, err = skipLiteral(b, i, "false"); err != nil {
				return 0, err
			}
		case c == 'n':
			if i, err = skipLiteral(b, i, "null"); err != nil {
				return 0, err
			}
		default:
			return 0, syntaxError("unexpected character", i)
		}
		if opened {
			continue
		}
		// A value ended at i: close containers until one wants another
		// element.
		for {
			if len(stack) == 0 {
				return i, nil
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, syntaxError("unexpected end", i)
			}
			top := stack[len(stack)-1]
			if b[i] == ',' {
				i = skipWS(b, i+1)
				if top == '{' {
					if i, err = skipKey(b, i); err != nil {
						return 0, err
					}
				}
				break
			}
			if top == '{' && b[i] == '}' || top == '[' && b[i] == ']' {
				i++
				stack = stack[:len(stack)-1]
				continue
			}
			return 0, syntaxError("expected ',' or a closing bracket", i)
		}
	}
}

// skipKey checks `"key" :` at b[i] and returns the index of the value.
func skipKey(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, syntaxError("expected a key", i)
	}
	i, _, err := skipString(b, i)
	if err != nil {
		return 0, err
	}
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, syntaxError("expected ':'", i)
	}
	return skipWS(b, i+1), nil
}
