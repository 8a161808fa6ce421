package refusal

import (
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
)

func TestWord(t *testing.T) {
	for _, tc := range []struct {
		line  string
		known bool
		want  string
	}{
		{"reset 1 2", true, "reset"},
		{"MTk4NjIy.SECRET", false, Unknown},
		{"", true, Unknown},
		{"   ", true, Unknown},
		{"r\x01eset", true, Unknown},
		{"averyveryveryveryverylongcommandword", true, "averyveryveryveryverylongcom..."},
	} {
		if got := Word(tc.line, tc.known); got != tc.want {
			t.Errorf("Word(%q, %v) = %q; want %q", tc.line, tc.known, got, tc.want)
		}
	}
}

func TestElide(t *testing.T) {
	for in, want := range map[string]string{
		`drain takes no argument, got "SECRET"`:   `drain takes no argument, got "..."`,
		`"a\"b": unknown; "c" and "d"`:            `"...": unknown; "..." and "..."`,
		"raw `SECRET` here":                       `raw "..." here`,
		`unterminated "SECRET`:                    `unterminated "..."`,
		"invalid character 'x' looking for value": "invalid character 'x' looking for value",
	} {
		if got := Elide(in); got != want {
			t.Errorf("Elide(%q) = %q; want %q", in, got, want)
		}
	}
}

// A key's burst bounds its own log, NodeBurst the node's over all keys,
// and each window's suppressed refusals are summed up once it ends.
func TestLimiter(t *testing.T) {
	clk := clock.NewFake()
	type flush struct{ key, n int }
	var flushed []flush
	l := &Limiter{Clock: clk, Flush: func(key, n int, _ time.Duration, _ time.Time, _ bool) { flushed = append(flushed, flush{key, n}) }}
	own, node := 0, 0
	for key := range 20 {
		for range 2 * Burst {
			o, n := l.Admit(key, clk.Now())
			if o {
				own++
			}
			if n {
				node++
			}
			if n && !o {
				t.Fatal("a line for the node's log that its key's log refused")
			}
		}
	}
	if own != 20*Burst || node != NodeBurst {
		t.Errorf("admitted %d to the keys' logs and %d to the node's; want %d and %d", own, node, 20*Burst, NodeBurst)
	}
	clk.Advance(Window)
	perKey, all := 0, 0
	for _, f := range flushed {
		if f.key == All {
			all += f.n
		} else if f.n != Burst {
			t.Errorf("key %d: %d suppressed; want %d", f.key, f.n, Burst)
		} else {
			perKey++
		}
	}
	if perKey != 20 || all != 20*Burst-NodeBurst {
		t.Errorf("summaries of %d keys and %d node-wide; want 20 and %d", perKey, all, 20*Burst-NodeBurst)
	}
}
