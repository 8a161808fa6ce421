package core_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/wire"
)

// A command's op is read by the reader the gateway client uses (package
// wire), so no spelling of a reserved op gets past the check: not a
// duplicate key, not a key in another case, not an escaped key.
func TestSendAmbiguousOp(t *testing.T) {
	e := newEnv(t, core.Config{Plan: core.Range(1, 0, 0)})
	e.startAll()
	for _, p := range []string{
		`{"op":2,"Op":3,"d":{"token":"stolen"}}`,
		`{"op":6,"OP":3,"d":{}}`,
		`{"op":1,"oP":3}`,
		`{"Op":3,"op":2}`,
		`{"op":2,"op":3}`,
		`{"op":3,"op":3}`,
		`{"\u006fp":2,"op":3}`,
		`{"\u004fp":3,"op":2}`,
		`{"op":3,"\u004fp":3}`,
		`{"Op":3}`,
		`{"op":2.0}`,
		`{"op":3e0}`,
		`{"op":"3"}`,
		`{"op":4294967298}`,
		`{"op":2,"d":{}} `,
	} {
		if err := e.node.Send(0, []byte(p)); !errors.Is(err, core.ErrUsage) {
			t.Errorf("Send(%s) = %v; want ErrUsage", p, err)
		}
	}
	if sent := e.conn(0).Sent(); len(sent) != 0 {
		t.Errorf("sent %q; want nothing", sent)
	}
	for _, p := range []string{`{"op":3,"d":{"status":"idle"}}`, `{"\u006fp":3}`, `{"d":{"op":2,"Op":1},"op":8}`} {
		if err := e.node.Send(0, []byte(p)); err != nil {
			t.Errorf("Send(%s) = %v; want it sent", p, err)
		}
	}
	if sent := e.conn(0).Sent(); len(sent) != 3 {
		t.Errorf("sent %d commands; want 3", len(sent))
	}
}

// FuzzSendOp: whatever the core's check lets through reaches the gateway
// as it was written, the gateway client's reader (wire.Read) reads an op
// the node does not reserve, and every other plausible reading of
// the op (encoding/json's case-insensitive last match, an exact first or
// last match) agrees with it.
func FuzzSendOp(f *testing.F) {
	for _, s := range []string{
		`{"op":3,"d":{"status":"idle"}}`, `{"op":2,"Op":3,"d":{}}`, `{"Op":3,"op":2}`,
		`{"op":6,"op":3}`, `{"\u006fp":1}`, `{"op":8,"d":{"guild_id":"1","query":"","limit":0}}`,
		`{"OP":1,"op":4}`, `{"op":-1}`, `{"op":4294967298}`, `[{"op":3}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e := newEnv(t, core.Config{Plan: core.Range(1, 0, 0)})
		e.startAll()
		if e.node.Send(0, b) != nil {
			return
		}
		sent := e.conn(0).Sent()
		if len(sent) != 1 || !bytes.Equal(sent[0], b) {
			t.Fatalf("Send(%q) accepted; the gateway got %q", b, sent)
		}
		env, err := wire.Read(sent[0])
		if err != nil {
			t.Fatalf("Send(%q) accepted; the gateway client reads %v", b, err)
		}
		switch env.Op {
		case 1, 2, 6:
			t.Fatalf("Send(%q) accepted; the gateway client reads reserved op %d", b, env.Op)
		}
		var folded struct{ Op *int }
		if json.Unmarshal(b, &folded) != nil || folded.Op == nil || *folded.Op != env.Op {
			t.Fatalf("Send(%q): encoding/json reads op %v; the gateway client %d", b, folded.Op, env.Op)
		}
		first, last, n := exactOps(t, b)
		if n != 1 || first != env.Op || last != env.Op {
			t.Fatalf("Send(%q): %d exact op keys, first %d, last %d; the gateway client reads %d", b, n, first, last, env.Op)
		}
	})
}

// exactOps reads the top-level keys spelt exactly "op" (once unescaped)
// with encoding/json's tokenizer.
func exactOps(t *testing.T, b []byte) (first, last, n int) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q is not an object to encoding/json: %v", b, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if tok != "op" {
			continue
		}
		var op int
		if json.Unmarshal(v, &op) != nil {
			t.Fatalf("%q: op %s is not an int to encoding/json", b, v)
		}
		if n == 0 {
			first = op
		}
		last = op
		n++
	}
	return first, last, n
}
