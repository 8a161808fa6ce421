package moveset

import (
	"fmt"
	"testing"
)

type color uint8

func (c color) String() string { return [...]string{"red", "green", "blue"}[c] }

func TestSet(t *testing.T) {
	s := Of[color](0, 2)
	for c, want := range []bool{true, false, true} {
		if got := s.Has(color(c)); got != want {
			t.Errorf("Of(red, blue).Has(%v) = %v; want %v", color(c), got, want)
		}
	}
	if got, want := s.String(), "{red blue}"; got != want {
		t.Errorf("Of(red, blue).String() = %q; want %q", got, want)
	}
	if got := Of[color]().String(); got != "{}" {
		t.Errorf("Of().String() = %q; want {}", got)
	}
}

func ExampleSet() {
	fmt.Println(Of[color](1, 0))
	// Output: {red green}
}
