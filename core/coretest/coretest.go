// Package coretest provides an in-memory core.Transport that records every
// connection attempt, and an in-memory core.SessionStore that records every
// call, for tests of the core and of the packages above it.
package coretest

import (
	"sync"

	"github.com/shardfs/shardfs/core"
)

// Transport records connections instead of opening them. Tests drive a
// shard by calling the Link methods of its latest Conn.
type Transport struct {
	mu    sync.Mutex
	conns []*Conn
	last  map[int]*Conn
	// OnConnect, when set, is called for every new connection, after
	// Connect has returned to the core.
	OnConnect func(*Conn)
	// Probe, when set, is called inside Connect, while the core holds the
	// shard: it may look at logs and clocks but not call the core.
	Probe func(core.Attempt)
	// Enders, when set, makes every new connection a core.Ender whose
	// Ended channel closes when the test calls its End.
	Enders bool
}

var _ core.Transport = (*Transport)(nil)

// Connect implements core.Transport.
func (t *Transport) Connect(l *core.Link, a core.Attempt) core.Conn {
	c := &Conn{Link: l, Attempt: a}
	if t.Probe != nil {
		t.Probe(a)
	}
	t.mu.Lock()
	if t.Enders {
		c.ended = make(chan struct{})
	}
	t.conns = append(t.conns, c)
	if t.last == nil {
		t.last = map[int]*Conn{}
	}
	t.last[a.Shard] = c
	hook := t.OnConnect
	t.mu.Unlock()
	if hook != nil {
		// Connect must not call the link synchronously; the hook runs once
		// the core has released the shard.
		go hook(c)
	}
	if c.ended != nil {
		return enderConn{c}
	}
	return c
}

// enderConn is a Conn that is also a core.Ender (Transport.Enders).
type enderConn struct{ *Conn }

func (c enderConn) Ended() <-chan struct{} { return c.ended }

// Abort implements core.Aborter: it records the call and ends the
// connection, as closing a socket does.
func (c enderConn) Abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.aborted = true
	c.endLocked()
}

// Aborted reports whether the core aborted the connection (Transport.Enders).
func (c *Conn) Aborted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.aborted
}

// End closes the Ended channel of a connection made with Transport.Enders:
// the connection writes no more.
func (c *Conn) End() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked()
}

func (c *Conn) endLocked() {
	if !c.over {
		c.over = true
		close(c.ended)
	}
}

// Conns returns every connection made so far, oldest first.
func (t *Transport) Conns() []*Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*Conn(nil), t.conns...)
}

// Last returns the latest connection of shard, or nil.
func (t *Transport) Last(shard int) *Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last[shard]
}

// Conn is one recorded connection.
type Conn struct {
	Link    *core.Link
	Attempt core.Attempt

	ended chan struct{} // Transport.Enders

	mu         sync.Mutex
	closeCodes []int
	aborted    bool
	over       bool // ended closed
	sent       [][]byte
	identifies int
}

// Close implements core.Conn.
func (c *Conn) Close(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeCodes = append(c.closeCodes, code)
}

// Send implements core.Conn.
func (c *Conn) Send(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, append([]byte(nil), p...))
	return nil
}

// Identify implements core.Conn.
func (c *Conn) Identify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.identifies++
}

// Closed returns the close codes the core used, in order.
func (c *Conn) Closed() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.closeCodes...)
}

// Sent returns the commands sent on the connection.
func (c *Conn) Sent() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.sent...)
}

// Identifies returns how many times the core asked to identify on the open
// socket.
func (c *Conn) Identifies() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.identifies
}
