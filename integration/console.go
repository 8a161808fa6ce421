package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// Console is the transcript of a guest's serial console. Expect reads it
// in order, marker by marker.
type Console struct {
	mu      sync.Mutex
	buf     []byte
	closed  bool
	changed chan struct{} // closed and replaced at every write and at Close
	pos     int           // where the next Expect starts
}

// NewConsole returns an empty, open console.
func NewConsole() *Console { return &Console{changed: make(chan struct{})} }

// Write appends guest output.
func (c *Console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	close(c.changed)
	c.changed = make(chan struct{})
	return len(p), nil
}

// Close marks the end of the output (QEMU exited).
func (c *Console) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.changed)
	}
}

// String returns the whole transcript.
func (c *Console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf)
}

// Expect waits until marker appears as a whole line's end after the text
// the previous Expect consumed, and returns the text from there up to the
// end of the marker's line. The marker may start anywhere in its line
// (firmware writes escape codes without a newline). It fails when ctx ends
// or the console closes first, returning the text it has seen.
func (c *Console) Expect(ctx context.Context, marker string) (string, error) {
	for {
		c.mu.Lock()
		text, ok := c.find(marker)
		closed, changed := c.closed, c.changed
		c.mu.Unlock()
		if ok {
			return text, nil
		}
		if closed {
			return text, fmt.Errorf("%w before %q", ErrExited, marker)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return text, fmt.Errorf("waiting for %q: %w", marker, context.Cause(ctx))
		}
	}
}

// find looks for marker followed by a line end after pos; on success it
// consumes the text up to that line end.
func (c *Console) find(marker string) (string, bool) {
	rest := string(c.buf[c.pos:])
	from := 0
	for {
		i := strings.Index(rest[from:], marker)
		if i < 0 {
			return rest, false
		}
		end := from + i + len(marker)
		if end == len(rest) {
			return rest, false // the line may go on
		}
		if rest[end] == '\r' || rest[end] == '\n' {
			c.pos += end
			return rest[:end], true
		}
		from = end
	}
}
