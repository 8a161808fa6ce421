package wire

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestReadOp(t *testing.T) {
	for _, tc := range []struct {
		in   string
		op   int
		want error
	}{
		{`{"op":3,"d":{"op":2,"Op":1}}`, 3, nil},
		{`{"\u006fp":3}`, 3, nil},
		{`{"op":2,"Op":3}`, 0, ErrAmbiguousOp},
		{`{"Op":3,"op":2}`, 0, ErrAmbiguousOp},
		{`{"op":2,"op":3}`, 0, ErrAmbiguousOp},
		{`{"\u004f\u0050":2,"op":3}`, 0, ErrAmbiguousOp},
		{`{"OP":2}`, 0, ErrAmbiguousOp},
		{`{"op":2,"Op":3,}`, 0, ErrSyntax},
		{`{"op":null}`, 0, ErrNoOp},
		{`{"d":{}}`, 0, ErrNoOp},
		{`[]`, 0, ErrNotObject},
	} {
		e, err := Read([]byte(tc.in))
		if !errors.Is(err, tc.want) || err == nil && e.Op != tc.op {
			t.Errorf("Read(%s) = op %d, %v; want op %d, %v", tc.in, e.Op, err, tc.op, tc.want)
		}
	}
}

// FuzzRead: Read accepts only what encoding/json calls valid JSON, and the
// d it returns is itself valid JSON.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		`{"op":0,"s":1,"t":"MESSAGE_CREATE","d":{"a":[1,"x",null]}}`, `{"op":2,"Op":3}`,
		`{"\u006fp":3}`, `{"op":1,"d":`, `{"op":0,"d":[[[]]]} `, "{\"op\":0,\"d\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Read(b)
		if err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("Read(%q) accepted what encoding/json refuses", b)
		}
		if e.D != nil && !json.Valid(e.D) {
			t.Fatalf("Read(%q): d %q is not JSON", b, e.D)
		}
	})
}
