package supervisor

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func blocks(a Assignment) string {
	var parts []string
	for _, b := range a.Blocks {
		parts = append(parts, b.ID+"="+FormatShards(b.Shards))
	}
	return strings.Join(parts, ";")
}

func TestByProcesses(t *testing.T) {
	for _, tc := range []struct {
		total, n int
		want     string
	}{
		{8, 2, "c0=0-3;c1=4-7"},
		{10, 3, "c0=0-3;c1=4-6;c2=7-9"},
		{1, 1, "c0=0"},
		{4, 4, "c0=0;c1=1;c2=2;c3=3"},
	} {
		a, err := ByProcesses(tc.total, tc.n)
		if err != nil {
			t.Fatalf("ByProcesses(%d, %d): %v", tc.total, tc.n, err)
		}
		if got := blocks(a); got != tc.want || len(a.Unowned) != 0 {
			t.Errorf("ByProcesses(%d, %d) = %s unowned %v; want %s", tc.total, tc.n, got, a.Unowned, tc.want)
		}
	}
}

func TestByShardsPerProcess(t *testing.T) {
	a, err := ByShardsPerProcess(10, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := blocks(a), "c0=0-3;c1=4-7;c2=8-9"; got != want {
		t.Errorf("ByShardsPerProcess(10, 4) = %s; want %s", got, want)
	}
}

func TestParseAssign(t *testing.T) {
	a, err := ParseAssign(12, " a=0-3 ; b=4-7,10 ;")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := blocks(a), "a=0-3;b=4-7,10"; got != want {
		t.Errorf("blocks = %s; want %s", got, want)
	}
	if want := []int{8, 9, 11}; !slices.Equal(a.Unowned, want) {
		t.Errorf("Unowned = %v; want %v", a.Unowned, want)
	}
	if a.Owner(10) != 1 || a.Owner(0) != 0 || a.Owner(9) != -1 {
		t.Errorf("Owner(10, 0, 9) = %d %d %d; want 1 0 -1", a.Owner(10), a.Owner(0), a.Owner(9))
	}
}

// TestBadAssignments: each bad input is refused with an error that names
// its offender.
func TestBadAssignments(t *testing.T) {
	long := strings.Repeat("x", MaxIDLen+1)
	for _, tc := range []struct {
		name string
		f    func() (Assignment, error)
		want []string // substrings of the error
	}{
		{"overlap", func() (Assignment, error) { return ParseAssign(8, "a=0-3;b=3-7") }, []string{"shard 3", `"a"`, `"b"`}},
		{"outside", func() (Assignment, error) { return ParseAssign(8, "a=0-3;b=4-8") }, []string{"shard 8", `"b"`, "total of 8"}},
		{"duplicate id", func() (Assignment, error) { return ParseAssign(8, "a=0-3;a=4-7") }, []string{`"a"`, "twice"}},
		{"duplicate shard", func() (Assignment, error) { return ParseAssign(8, "a=0-3,2") }, []string{"shard 2", "twice"}},
		{"long id", func() (Assignment, error) { return ParseAssign(8, long+"=0-3") }, []string{"129 characters", "over 128"}},
		{"empty id", func() (Assignment, error) { return ParseAssign(8, "=0-3") }, []string{"empty ID"}},
		{"bad id", func() (Assignment, error) { return ParseAssign(8, "a b=0-3") }, []string{`"a b"`, `' '`}},
		{"no equals", func() (Assignment, error) { return ParseAssign(8, "a:0-3") }, []string{`"a:0-3"`, "ID=SHARDS"}},
		{"bad list", func() (Assignment, error) { return ParseAssign(8, "a=3-1") }, []string{`"a"`, `"3-1"`}},
		{"empty", func() (Assignment, error) { return ParseAssign(8, " ; ") }, []string{"names no child"}},
		{"processes over total", func() (Assignment, error) { return ByProcesses(4, 5) }, []string{"--processes 5", "total of 4"}},
		{"processes zero", func() (Assignment, error) { return ByProcesses(4, 0) }, []string{"--processes 0"}},
		{"per process zero", func() (Assignment, error) { return ByShardsPerProcess(4, 0) }, []string{"--shards-per-process 0"}},
		{"total zero", func() (Assignment, error) { return ByProcesses(0, 1) }, []string{"total 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.f()
			if err == nil {
				t.Fatalf("got %s, no error; want one naming %q", blocks(a), tc.want)
			}
			if !errors.Is(err, ErrAssignment) {
				t.Errorf("error %q does not wrap ErrAssignment", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q; want it to contain %q", err, w)
				}
			}
		})
	}
}

func FuzzParseAssign(f *testing.F) {
	for _, s := range []string{"a=0-3;b=4-7", "a=0;b=1;c=2-5,9", "x=0-3;x=1", "a=0-99999999", ";;", "a=1-0"} {
		f.Add(16, s)
	}
	f.Fuzz(func(t *testing.T, total int, spec string) {
		if total < 1 || total > 4096 {
			return
		}
		a, err := ParseAssign(total, spec)
		if err != nil {
			return
		}
		// Every shard of the total is owned once or reported unowned.
		count := make([]int, total)
		ids := map[string]bool{}
		for _, b := range a.Blocks {
			if ids[b.ID] || len(b.ID) == 0 || len(b.ID) > MaxIDLen {
				t.Fatalf("bad or duplicate id %q accepted from %q", b.ID, spec)
			}
			ids[b.ID] = true
			for _, s := range b.Shards {
				count[s]++
			}
		}
		for _, s := range a.Unowned {
			count[s]++
		}
		for s, c := range count {
			if c != 1 {
				t.Fatalf("shard %d counted %d times from %q", s, c, spec)
			}
		}
	})
}
