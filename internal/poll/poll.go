// Package poll waits, with a bound, for a state that can only be observed by
// asking again: a subprocess or a QEMU guest, across a process boundary.
//
// Inside one process a test waits on a channel or a condition instead; poll
// is for the places where nothing can signal the change.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrBound is wrapped by the error of Until when the bound passed before the
// state was reached.
var ErrBound = errors.New("bound passed")

// Until asks cond every interval until it returns nil, for at most bound (or
// until ctx ends). While the state is not reached, cond returns an error
// that describes what it saw; the last one is in the error Until returns,
// so a failure says what was waited for and what was seen last. cond gives
// up early by returning Stop(err): Until then returns err.
func Until(ctx context.Context, what string, bound, interval time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		last := cond()
		if last == nil {
			return nil
		}
		if s, ok := last.(stop); ok {
			return s.err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			why := ctx.Err()
			if errors.Is(why, context.DeadlineExceeded) {
				why = ErrBound
			}
			return fmt.Errorf("%s: %w after %v; last: %w", what, why, bound, last)
		}
	}
}

// Stop marks err, returned by a cond of Until, as final: the state will not
// be reached (the process exited, say), so polling ends with err.
func Stop(err error) error { return stop{err} }

type stop struct{ err error }

func (s stop) Error() string { return s.err.Error() }
