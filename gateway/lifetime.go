package gateway

import "sync"

// lifetime admits goroutines and timer callbacks until it is closed, and
// waits for every one it admitted: whoever starts a goroutine owns it, and
// nothing starts once Close began.
type lifetime struct {
	// mu guards closed and admission to wg, so that no Add follows the
	// Wait of close.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// enter admits one piece of work unless the lifetime closed; the caller
// calls leave when the work is done.
func (l *lifetime) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	return true
}

// extend admits one more piece of work on behalf of a caller that holds an
// admission, so it cannot fail: the work it hands over (a parked
// connection) outlives the caller's own.
func (l *lifetime) extend() { l.wg.Add(1) }

// leave ends a piece of work admitted by enter or extend.
func (l *lifetime) leave() { l.wg.Done() }

// Go runs f in a goroutine unless the lifetime closed.
func (l *lifetime) Go(f func()) bool {
	if !l.enter() {
		return false
	}
	go func() {
		defer l.leave()
		f()
	}()
	return true
}

// isClosed reports whether close was called.
func (l *lifetime) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// close refuses new work from now on; it reports false when the lifetime
// was already closed.
func (l *lifetime) close() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.closed = true
	return true
}

// wait waits for every piece of work admitted; call it after close.
func (l *lifetime) wait() { l.wg.Wait() }
