package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestUntilReached(t *testing.T) {
	calls := 0
	err := Until(context.Background(), "third call", time.Minute, time.Millisecond, func() error {
		calls++
		if calls == 3 {
			return nil
		}
		return fmt.Errorf("call %d", calls)
	})
	if err != nil {
		t.Errorf("Until(third call) = %v; want nil", err)
	}
	if calls != 3 {
		t.Errorf("cond called %d times; want 3", calls)
	}
}

func TestUntilBoundSaysWhatAndLast(t *testing.T) {
	calls := 0
	err := Until(context.Background(), "never", 20*time.Millisecond, time.Millisecond, func() error {
		calls++
		return fmt.Errorf("state %d", calls)
	})
	if !errors.Is(err, ErrBound) {
		t.Fatalf("Until(never) = %v; want ErrBound", err)
	}
	want := fmt.Sprintf("state %d", calls)
	if !strings.HasPrefix(err.Error(), "never: ") || !strings.HasSuffix(err.Error(), "last: "+want) {
		t.Errorf("Until(never) = %q; want what was waited for and %q", err, want)
	}
}

func TestUntilStop(t *testing.T) {
	gone := errors.New("process exited")
	calls := 0
	err := Until(context.Background(), "ready", time.Minute, time.Millisecond, func() error {
		calls++
		return Stop(gone)
	})
	if err != gone || calls != 1 {
		t.Errorf("Until(ready) = %v after %d calls; want %v after 1", err, calls, gone)
	}
}

func TestUntilContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Until(ctx, "cancelled", time.Minute, time.Millisecond, func() error { return errors.New("not yet") })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Until(cancelled) = %v; want context.Canceled", err)
	}
}
