// Package wire reads the envelope of gateway payloads: op, s, t and the raw
// d of one JSON object, validated as strict JSON without decoding d.
//
// The gateway client reads every frame the gateway sends with it, and the
// core reads every command an operator writes to /N/send with it before
// deciding whether the op is one the node owns. One reader for both
// is the point: a check that reads a payload differently from the code
// that acts on it can be walked around (encoding/json matches keys without
// regard to case and keeps the last duplicate, so {"op":2,"Op":3} read as
// op 3 there). The package sits below both core and gateway, which import
// nothing of each other's for it; it imports only the standard library.
//
// An object with more than one key that reads as op once unescaped, or
// with a key that differs from "op" only in case ("Op", "OP"), is refused
// (ErrAmbiguousOp), from the gateway as from an operator: a platform's
// parser may take the first, the last or a case-folded match, and this
// reader must not guess which.
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// MaxDepth bounds the nesting of a payload, as encoding/json does, so that a
// hostile payload of ten million '[' cannot exhaust memory in the scanner.
const MaxDepth = 10000

// Envelope is one gateway payload as the node needs it: op, s and t
// decoded, d kept as raw bytes into the message.
type Envelope struct {
	Op   int
	Seq  int64  // s; -1 when absent or null
	Name []byte // t without its quotes; nil when absent or null
	D    []byte // d as it came; nil when absent
	// NameEscaped is set when t used escapes, so Name is not its value.
	NameEscaped bool
}

var (
	ErrNotObject = errors.New("payload is not a JSON object")
	ErrNoOp      = errors.New("payload has no integer op")
	// ErrAmbiguousOp: more than one op key, or one in another case.
	ErrAmbiguousOp = errors.New("payload has more than one op key, or one in another case")
	ErrSyntax      = errors.New("invalid JSON")
)

// SyntaxError says where a payload stopped being JSON, without quoting it:
// payloads may carry anything, and errors end up in event logs.
func SyntaxError(what string, at int) error {
	return fmt.Errorf("%w: %s at byte %d", ErrSyntax, what, at)
}

// Read decodes the envelope of one payload. The whole message is validated
// as strict JSON (what encoding/json.Valid accepts), but only op, s and t
// are decoded; d stays raw. Of several s, t or d, the last counts, as in
// encoding/json; several op keys are an error.
func Read(b []byte) (Envelope, error) {
	p := Envelope{Op: -1, Seq: -1}
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return p, ErrNotObject
	}
	hasOp, ambiguous := false, false
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return p, SyntaxError("expected a key", i)
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
				return p, SyntaxError("expected ':'", i)
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
				if hasOp {
					ambiguous = true
				}
				op, ok := Int(v)
				if !ok || op < -1<<31 || op >= 1<<31 {
					return p, ErrNoOp
				}
				p.Op, hasOp = int(op), true
			case "s":
				switch {
				case IsNull(v):
					p.Seq = -1
				default:
					s, ok := Int(v)
					if !ok || s < 0 {
						return p, fmt.Errorf("%w: s is not a sequence", ErrSyntax)
					}
					p.Seq = s
				}
			case "t":
				switch {
				case IsNull(v):
					p.Name, p.NameEscaped = nil, false
				case v[0] == '"':
					p.Name = v[1 : len(v)-1]
					_, p.NameEscaped, _ = skipString(v, 0)
				default:
					return p, fmt.Errorf("%w: t is not a string", ErrSyntax)
				}
			case "d":
				p.D = v
			default:
				// "Op", "oP", "OP" (escaped or not): ASCII case folding
				// is all there is for these two letters.
				if len(key) == 2 && key[0]|0x20 == 'o' && key[1]|0x20 == 'p' {
					ambiguous = true
				}
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
			return p, SyntaxError("expected ',' or '}'", i)
		}
	}
	if i = skipWS(b, i); i != len(b) {
		return p, SyntaxError("data after the payload", i)
	}
	// Checked after the whole message is valid, so that a broken payload
	// is reported as broken, not as ambiguous.
	if ambiguous {
		return p, ErrAmbiguousOp
	}
	if !hasOp {
		return p, ErrNoOp
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

// IsNull reports whether the raw value v is null.
func IsNull(v []byte) bool { return len(v) == 4 && string(v) == "null" }

// Int reads a JSON number that is an integer (no fraction, no exponent)
// into an int64.
func Int(v []byte) (int64, bool) {
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

// String decodes a JSON string value; ok is false for anything else.
func String(v []byte) (string, bool) {
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

// Member returns the raw value of key in the JSON object obj, which must
// already be valid JSON; of several, the last, as encoding/json does.
func Member(obj []byte, key string) (v []byte, ok bool) {
	EachMember(obj, key, func(start, end int) { v, ok = obj[start:end], true })
	return v, ok
}

// EachMember calls fn with the span of every value of key in the JSON
// object obj, in order, so that a value can be replaced in place.
func EachMember(obj []byte, key string, fn func(start, end int)) {
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
			return 0, false, SyntaxError("unterminated string", i)
		}
		switch b[j] {
		case '"':
			return j + 1, escaped, nil
		case '\\':
			escaped = true
			if j+1 >= len(b) {
				return 0, false, SyntaxError("unterminated escape", j)
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return 0, false, SyntaxError("invalid \\u escape", j)
				}
				j += 6
			default:
				return 0, false, SyntaxError("invalid escape", j)
			}
		default:
			return 0, false, SyntaxError("control character in string", j)
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
		return 0, SyntaxError("invalid number", start)
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return 0, SyntaxError("invalid number", start)
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
			return 0, SyntaxError("invalid number", start)
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, nil
}

func skipLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, SyntaxError("invalid literal", i)
	}
	return i + len(lit), nil
}

// skipValue checks the JSON value starting at b[i] (no leading whitespace),
// nested inside outer containers, and returns the index after it. It is
// iterative, with an explicit stack of open containers; like encoding/json
// it refuses more than MaxDepth levels in all.
func skipValue(b []byte, i, outer int) (int, error) {
	var stackBuf [64]byte
	stack := stackBuf[:0] // '{' or '[' per open container
	var err error
	for {
		// A value starts at i.
		if i >= len(b) {
			return 0, SyntaxError("unexpected end", i)
		}
		opened := false
		switch c := b[i]; {
		case c == '{':
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			if outer+len(stack) >= MaxDepth {
				return 0, SyntaxError("nesting too deep", i)
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
			if outer+len(stack) >= MaxDepth {
				return 0, SyntaxError("nesting too deep", i)
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
			return 0, SyntaxError("unexpected character", i)
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
				return 0, SyntaxError("unexpected end", i)
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
			return 0, SyntaxError("expected ',' or a closing bracket", i)
		}
	}
}

// skipKey checks `"key" :` at b[i] and returns the index of the value.
func skipKey(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		return 0, SyntaxError("expected a key", i)
	}
	i, _, err := skipString(b, i)
	if err != nil {
		return 0, err
	}
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, SyntaxError("expected ':'", i)
	}
	return skipWS(b, i+1), nil
}
