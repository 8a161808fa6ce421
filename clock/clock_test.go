package clock

import (
	"testing"
	"time"
)

func TestFakeFiresInOrder(t *testing.T) {
	c := NewFake()
	var got []string
	c.AfterFunc(3*time.Second, func() { got = append(got, "c") })
	c.AfterFunc(1*time.Second, func() {
		got = append(got, "a")
		c.AfterFunc(time.Second, func() { got = append(got, "b@"+c.Now().Sub(Epoch).String()) })
	})
	stopped := c.AfterFunc(2*time.Second, func() { got = append(got, "never") })
	if !stopped.Stop() {
		t.Fatal("Stop() = false on a pending timer; want true")
	}
	c.Advance(3 * time.Second)
	want := []string{"a", "b@2s", "c"}
	if len(got) != len(want) {
		t.Fatalf("fired %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("fired %v; want %v", got, want)
		}
	}
	if c.Now().Sub(Epoch) != 3*time.Second {
		t.Fatalf("Now() = Epoch+%v; want Epoch+3s", c.Now().Sub(Epoch))
	}
}

func TestFakeResetAndZeroDelay(t *testing.T) {
	c := NewFake()
	n := 0
	tm := c.AfterFunc(0, func() { n++ })
	if n != 0 {
		t.Fatal("a zero-delay timer fired inside AfterFunc")
	}
	if !tm.Reset(5 * time.Second) {
		t.Fatal("Reset() = false on a pending timer; want true")
	}
	c.Advance(4 * time.Second)
	if n != 0 {
		t.Fatalf("timer fired after 4s; it was reset to 5s")
	}
	c.Advance(time.Second)
	if n != 1 {
		t.Fatalf("fired %d times by 5s; want 1", n)
	}
	if tm.Stop() {
		t.Fatal("Stop() = true on a fired timer; want false")
	}
	if d, ok := c.Next(); ok {
		t.Fatalf("Next() = %v, true with no timer pending", d)
	}
}

func TestRealFires(t *testing.T) {
	done := make(chan struct{})
	Or(nil).AfterFunc(time.Millisecond, func() { close(done) })
	<-done
}

func TestFakeJumpWallMovesNowOnly(t *testing.T) {
	c := NewFake()
	fired := false
	c.AfterFunc(2*time.Second, func() { fired = true })
	c.Advance(time.Second)
	c.JumpWall(time.Hour)
	if got := c.Now().Sub(Epoch); got != time.Hour+time.Second {
		t.Fatalf("Now() after JumpWall(1h) = Epoch+%v; want Epoch+1h1s", got)
	}
	if got := Mono(c); got != time.Second {
		t.Fatalf("Mono() after JumpWall(1h) = %v; want 1s", got)
	}
	if fired {
		t.Fatal("a wall step fired a timer")
	}
	c.JumpWall(-2 * time.Hour)
	c.Advance(time.Second)
	if !fired || Mono(c) != 2*time.Second {
		t.Fatalf("after Advance(1s): fired %v, Mono %v; want true, 2s", fired, Mono(c))
	}
}

// TestRealMonoGrows: Mono(Real) moves with the monotonic clock, by what
// time.Since measures around it, no less and no more. (Comparing two
// readings alone would pass a Mono that never moves.)
func TestRealMonoGrows(t *testing.T) {
	before := time.Now()
	a := Mono(Real{})
	t0 := time.Now()
	for time.Since(t0) < time.Millisecond {
		// Spin: the subject is the real clock itself.
	}
	b := Mono(Real{})
	span := time.Since(before)
	if d := b - a; d < time.Millisecond || d > span {
		t.Fatalf("Mono(Real) moved %v across a spin of at least 1ms within %v; want in [1ms, %v]", d, span, span)
	}
}
