// Package sessions is the encoding of a shard's session snapshot (DESIGN.md
// section 7.1) that every session store keeps.
//
// Decode is strict, so that anything a store returns is what Encode wrote:
// field names match exactly and at most once, every field is present, no
// other field is allowed, numbers are integers, and nothing may follow the
// object. No error shows a value read from the input, so a session id never
// reaches a log. saved_at keeps milliseconds; finer time is dropped.
package sessions

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/core"
)

// MaxSize bounds an encoded snapshot. A real one is a few hundred bytes; the
// bound keeps a store from reading whatever a damaged file holds.
const MaxSize = 64 << 10

// ErrMalformed is wrapped by every Decode error.
var ErrMalformed = errors.New("malformed snapshot")

// wire is the file format. core.Session hides its ID from encoders, so the
// snapshot is copied field by field.
type wire struct {
	Flavor    string `json:"flavor"`
	SessionID string `json:"session_id"`
	Sequence  int64  `json:"sequence"`
	ResumeURL string `json:"resume_url"`
	Total     int    `json:"total"`
	SavedAt   int64  `json:"saved_at"`
}

// Encode returns s as one line of JSON. It refuses a snapshot that Decode
// would refuse.
func Encode(s core.Snapshot) ([]byte, error) {
	w := wire{
		SessionID: s.Session.ID,
		Sequence:  s.Sequence,
		ResumeURL: s.Session.ResumeURL,
		Total:     s.Total,
		SavedAt:   s.SavedAt.UnixMilli(),
	}
	switch s.Flavor {
	case core.Discord, core.Fluxer:
		w.Flavor = s.Flavor.String()
	default:
		return nil, fmt.Errorf("sessions: cannot encode a snapshot: unknown flavor %d", s.Flavor)
	}
	if err := w.check(); err != nil {
		return nil, fmt.Errorf("sessions: cannot encode a snapshot: %s", err)
	}
	// json.Marshal would quietly turn invalid UTF-8 into U+FFFD: the id
	// read back would not be the id saved.
	if !utf8.ValidString(w.SessionID) {
		return nil, errors.New("sessions: cannot encode a snapshot: session_id is not UTF-8")
	}
	if !utf8.ValidString(w.ResumeURL) {
		return nil, errors.New("sessions: cannot encode a snapshot: resume_url is not UTF-8")
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("sessions: cannot encode a snapshot: %v", err)
	}
	b = append(b, '\n')
	if len(b) > MaxSize {
		return nil, fmt.Errorf("sessions: cannot encode a snapshot: %d bytes, larger than the %d a snapshot may be", len(b), MaxSize)
	}
	return b, nil
}

func (w *wire) check() error {
	switch {
	case w.Sequence < 0:
		return errors.New("sequence is negative")
	case w.Total < 0:
		return errors.New("total is negative")
	case w.SavedAt < 0:
		return errors.New("saved_at is before 1970")
	}
	return nil
}

// Decode reads a snapshot that Encode wrote.
func Decode(b []byte) (core.Snapshot, error) {
	w, err := decode(b)
	if err != nil {
		return core.Snapshot{}, fmt.Errorf("%w: %s", ErrMalformed, err)
	}
	flavor, err := core.ParseFlavor(w.Flavor)
	if err != nil {
		// ParseFlavor's error quotes the input.
		return core.Snapshot{}, fmt.Errorf("%w: unknown flavor", ErrMalformed)
	}
	return core.Snapshot{
		Flavor:   flavor,
		Session:  core.Session{ID: w.SessionID, ResumeURL: w.ResumeURL},
		Sequence: w.Sequence,
		Total:    w.Total,
		SavedAt:  time.UnixMilli(w.SavedAt),
	}, nil
}

// decode walks the tokens itself: encoding/json's Unmarshal matches names
// without regard to case, takes the last of duplicate names, cannot tell a
// missing field from a zero one, and quotes the input in its errors.
func decode(b []byte) (wire, error) {
	var w wire
	if len(b) > MaxSize {
		return w, fmt.Errorf("%d bytes, larger than the %d a snapshot may be", len(b), MaxSize)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return w, errors.New("empty")
	}
	if !utf8.Valid(b) {
		return w, errors.New("not UTF-8")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	tok, err := token(d)
	if err != nil {
		return w, err
	}
	if tok != json.Delim('{') {
		return w, errors.New("not a JSON object")
	}
	var total int64 // w.Total is an int
	fields := []struct {
		name string
		str  *string
		num  *int64
		seen bool
	}{
		{name: "flavor", str: &w.Flavor},
		{name: "session_id", str: &w.SessionID},
		{name: "sequence", num: &w.Sequence},
		{name: "resume_url", str: &w.ResumeURL},
		{name: "total", num: &total},
		{name: "saved_at", num: &w.SavedAt},
	}
	for d.More() {
		tok, err := token(d)
		if err != nil {
			return w, err
		}
		name, _ := tok.(string) // More and the decoder's syntax check leave only names here
		i := 0
		for i < len(fields) && fields[i].name != name {
			i++
		}
		if i == len(fields) {
			return w, fmt.Errorf("unknown field %q", cut(name))
		}
		f := &fields[i]
		if f.seen {
			return w, fmt.Errorf("%s appears twice", name)
		}
		f.seen = true
		if tok, err = token(d); err != nil {
			return w, err
		}
		if f.str != nil {
			s, ok := tok.(string)
			if !ok {
				return w, fmt.Errorf("%s is not a string", name)
			}
			*f.str = s
			continue
		}
		n, ok := tok.(json.Number)
		if !ok {
			return w, fmt.Errorf("%s is not an integer", name)
		}
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return w, fmt.Errorf("%s is not an integer", name)
		}
		*f.num = v
	}
	if _, err := token(d); err != nil { // the closing brace
		return w, err
	}
	for _, f := range fields {
		if !f.seen {
			return w, fmt.Errorf("missing %s", f.name)
		}
	}
	if int64(int(total)) != total {
		return w, errors.New("total is not an integer")
	}
	w.Total = int(total)
	if err := w.check(); err != nil {
		return w, err
	}
	if _, err := d.Token(); err != io.EOF {
		return w, errors.New("trailing data after the object")
	}
	return w, nil
}

// token reads one token, naming a syntax error by its offset only.
func token(d *json.Decoder) (json.Token, error) {
	tok, err := d.Token()
	var syntax *json.SyntaxError
	switch {
	case err == nil:
		return tok, nil
	case err == io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
		return nil, errors.New("truncated")
	case errors.As(err, &syntax):
		return nil, fmt.Errorf("not JSON (syntax error at byte %d)", syntax.Offset)
	}
	return nil, errors.New("not JSON")
}

// cut keeps an unknown name short: it is read from the input.
func cut(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}
