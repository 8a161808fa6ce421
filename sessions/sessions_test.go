package sessions

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

// secret stands in for a session id; no error may contain it.
const secret = "0123456789abcdef0123456789abcdef"

func snap() core.Snapshot {
	return core.Snapshot{
		Flavor:   core.Fluxer,
		Session:  core.Session{ID: secret, ResumeURL: "wss://gateway.example/resume"},
		Sequence: 42,
		Total:    16,
		SavedAt:  time.UnixMilli(1_796_000_000_123),
	}
}

func TestEncodeIsTheDesignJSON(t *testing.T) {
	got, err := Encode(snap())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"flavor":"fluxer","session_id":"` + secret + `","sequence":42,"resume_url":"wss://gateway.example/resume","total":16,"saved_at":1796000000123}` + "\n"
	if string(got) != want {
		t.Fatalf("Encode() = %s; want %s", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	used := snap()
	used.Session.ID = ""
	discord := snap()
	discord.Flavor = core.Discord
	sub := snap()
	sub.SavedAt = sub.SavedAt.Add(999 * time.Microsecond) // below a millisecond: dropped
	for _, s := range []core.Snapshot{snap(), used, discord, sub} {
		b, err := Encode(s)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", s, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		want := s
		want.SavedAt = s.SavedAt.Truncate(time.Millisecond)
		if !equal(got, want) {
			t.Fatalf("Decode(Encode(%+v)) = %+v (id %q); want id %q", want, got, got.Session.ID, want.Session.ID)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*core.Snapshot)
		want string
	}{
		{"unknown flavor", func(s *core.Snapshot) { s.Flavor = 7 }, "unknown flavor"},
		{"negative sequence", func(s *core.Snapshot) { s.Sequence = -1 }, "sequence is negative"},
		{"negative total", func(s *core.Snapshot) { s.Total = -1 }, "total is negative"},
		{"before 1970", func(s *core.Snapshot) { s.SavedAt = time.Time{} }, "saved_at is before 1970"},
		{"id not UTF-8", func(s *core.Snapshot) { s.Session.ID = "\xff" + secret }, "session_id is not UTF-8"},
		{"url not UTF-8", func(s *core.Snapshot) { s.Session.ResumeURL = "wss://\xff" }, "resume_url is not UTF-8"},
		{"too large", func(s *core.Snapshot) { s.Session.ResumeURL = strings.Repeat("u", MaxSize) }, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap()
			tc.edit(&s)
			_, err := Encode(s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Encode() error = %v; want one saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("Encode() error %q shows the session id", err)
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	const good = `{"flavor":"discord","session_id":"` + secret + `","sequence":3,"resume_url":"wss://r","total":2,"saved_at":1796000000000}`
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", ``, "empty"},
		{"truncated", good[:len(good)/2], "truncated"},
		{"truncated after the object opens", `{`, "truncated"},
		{"not JSON", `shard 3 session ` + secret, "not JSON"},
		{"bad escape in the id", `{"session_id":"` + secret + `\q"}`, "not JSON"},
		{"not an object", `[1,2]`, "not a JSON object"},
		{"a string", `"` + secret + `"`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"unknown flavor", strings.Replace(good, `"discord"`, `"slack"`, 1), "unknown flavor"},
		{"flavor not a string", strings.Replace(good, `"discord"`, `1`, 1), "flavor is not a string"},
		{"missing flavor", strings.Replace(good, `"flavor":"discord",`, ``, 1), "missing flavor"},
		{"missing session_id", strings.Replace(good, `"session_id":"`+secret+`",`, ``, 1), "missing session_id"},
		{"missing sequence", strings.Replace(good, `"sequence":3,`, ``, 1), "missing sequence"},
		{"missing resume_url", strings.Replace(good, `"resume_url":"wss://r",`, ``, 1), "missing resume_url"},
		{"missing total", strings.Replace(good, `"total":2,`, ``, 1), "missing total"},
		{"missing saved_at", strings.Replace(good, `,"saved_at":1796000000000`, ``, 1), "missing saved_at"},
		{"session_id null", strings.Replace(good, `"`+secret+`"`, `null`, 1), "session_id is not a string"},
		{"session_id a number", strings.Replace(good, `"`+secret+`"`, `12345`, 1), "session_id is not a string"},
		{"negative sequence", strings.Replace(good, `"sequence":3`, `"sequence":-3`, 1), "sequence is negative"},
		{"fractional sequence", strings.Replace(good, `"sequence":3`, `"sequence":3.5`, 1), "sequence is not an integer"},
		{"exponent sequence", strings.Replace(good, `"sequence":3`, `"sequence":3e2`, 1), "sequence is not an integer"},
		{"huge sequence", strings.Replace(good, `"sequence":3`, `"sequence":99999999999999999999`, 1), "sequence is not an integer"},
		{"sequence a string", strings.Replace(good, `"sequence":3`, `"sequence":"3"`, 1), "sequence is not an integer"},
		{"negative total", strings.Replace(good, `"total":2`, `"total":-2`, 1), "total is negative"},
		{"negative saved_at", strings.Replace(good, `1796000000000`, `-1`, 1), "saved_at is before 1970"},
		{"duplicate field", strings.Replace(good, `"total":2`, `"total":2,"total":3`, 1), "total appears twice"},
		{"field in another case", strings.Replace(good, `"total"`, `"Total"`, 1), `unknown field "Total"`},
		{"unknown field", strings.Replace(good, `"total":2`, `"total":2,"shard":1`, 1), `unknown field "shard"`},
		{"long unknown field is cut", strings.Replace(good, `"total":2`, `"total":2,"`+secret+`":1`, 1), `unknown field "0123456789abcdef…"`},
		{"nested value", strings.Replace(good, `"total":2`, `"total":{"n":2}`, 1), "total is not an integer"},
		{"trailing data", good + `{}`, "trailing data"},
		{"trailing garbage", good + ` x`, "trailing data"},
		{"two objects", good + good, "trailing data"},
		{"not UTF-8", strings.Replace(good, secret, "\xff"+secret, 1), "not UTF-8"},
		{"oversized", `{"flavor":"discord","resume_url":"` + strings.Repeat("u", MaxSize) + `"}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode(%.60q) error = %v; want one saying %q", tc.in, err, tc.want)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode(%.60q) error = %v; want it to wrap ErrMalformed", tc.in, err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "89abcdef0") {
				t.Fatalf("Decode() error %q shows the session id", err)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     core.Snapshot
	}{
		{"any field order, spaces, trailing newline",
			" {\"total\": 1, \"saved_at\": 0, \"resume_url\": \"\", \"sequence\": 0, \"session_id\": \"\", \"flavor\": \"fluxer\"}\n\n",
			core.Snapshot{Flavor: core.Fluxer, Total: 1, SavedAt: time.UnixMilli(0)}},
		{"escapes",
			`{"flavor":"discord","session_id":"a\u0062c","sequence":9007199254740993,"resume_url":"wss:\/\/x","total":0,"saved_at":5}`,
			core.Snapshot{Flavor: core.Discord, Session: core.Session{ID: "abc", ResumeURL: "wss://x"}, Sequence: 9007199254740993, SavedAt: time.UnixMilli(5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !equal(got, tc.want) {
				t.Fatalf("Decode(%q) = %+v; want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func equal(a, b core.Snapshot) bool {
	return a.Flavor == b.Flavor && a.Session.ID == b.Session.ID && a.Session.ResumeURL == b.Session.ResumeURL &&
		a.Sequence == b.Sequence && a.Total == b.Total && a.SavedAt.Equal(b.SavedAt)
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"flavor":"discord","session_id":"abc","sequence":3,"resume_url":"wss://r","total":2,"saved_at":1796000000000}`,
		`{"flavor":"fluxer","session_id":"","sequence":0,"resume_url":"","total":0,"saved_at":0}`,
		`{"saved_at":9223372036854775807,"total":9223372036854775807,"resume_url":"\u00e9\ud83d\ude00","sequence":9223372036854775807,"session_id":"\"\\","flavor":"fluxer"}`,
		`{"flavor":"discord"}`,
		`{"flavor":"discord","flavor":"discord"}`,
		`{"flavor":"discord","session_id":"abc","sequence":3,"resume_url":"wss://r","total":2,"saved_at":1796000000000}{}`,
		`{"flavor":"discord","session_id":"abc","sequence":-0,"resume_url":"wss://r","total":2,"saved_at":1e3}`,
		`[]`, `null`, `{`, ``, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := Decode(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode error %v does not wrap ErrMalformed", err)
			}
			return
		}
		b, err := Encode(s)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", in, err)
		}
		again, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(%q))) = %q: %v", in, b, err)
		}
		if !equal(again, s) {
			t.Fatalf("Decode(%q) = %+v, then %+v after a round trip", in, s, again)
		}
		if b2, _ := Encode(again); !bytes.Equal(b2, b) {
			t.Fatalf("Encode is not stable: %q then %q", b, b2)
		}
	})
}
