package gateway

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// errFenced is the error of a write refused by the connection's fence.
var errFenced = errors.New("the shard's lease ran out (fencing deadline passed): connection dropped without writing")

// errUnconfirmed ends a connection whose received event was not
// confirmed (core.Link.Confirmed): the socket closes without a write,
// since the lease may be another node's now.
var errUnconfirmed = errors.New("a received event was not confirmed (the lease may be gone): dropped it and the connection, writing nothing")

// fencedConn checks the connection's fence (core.Attempt.Fence: the boot
// clock and the wall clock, core.Fence.Open) before every write that reaches the socket: the HTTP
// upgrade, identify, resume, heartbeats, commands, gorilla's pongs and
// close frames alike. Past the deadline it closes the socket without
// writing and fails the write, so that a node woken from a pause sends no
// frame for a shard it may no longer own, whichever of its overdue timers
// runs first. The check and the write are a few instructions apart; a
// pause that falls exactly between them is the residue no user-space
// check can close, which is why the deadline keeps a second of margin
// before etcd's own expiry (lease/etcd). The TLS handshake below it is not
// fenced: it carries no gateway frame.
type fencedConn struct {
	net.Conn
	fence *core.Fence
	clock clock.Clock
	log   *slog.Logger
	shard int
	cut   atomic.Bool
}

func (c *fencedConn) Write(p []byte) (int, error) {
	if !c.fence.Open(c.clock) {
		if !c.cut.Swap(true) {
			_ = c.Conn.Close()
			c.log.Warn("gateway: fencing deadline passed; dropped the connection without writing", "shard", c.shard, "bytes", len(p))
		}
		return 0, errFenced
	}
	return c.Conn.Write(p)
}

// fenced wraps nc when the attempt carries a fence.
func (c *conn) fenced(nc net.Conn) net.Conn {
	if c.a.Fence == nil {
		return nc
	}
	return &fencedConn{Conn: nc, fence: c.a.Fence, clock: c.t.clock, log: c.t.log, shard: c.a.Shard}
}

// errIdentifyLate is the failure of an attempt whose identify would have
// gone out after the slot's identify-by deadline.
var errIdentifyLate = errors.New("identify not written: the identify slot's deadline passed before the identify could go out (a stall between the grant and the identify); the slot was given back")

// identifyLate checks the attempt's identify-by deadline (core.Attempt.
// IdentifyBy) just before the identify is written: the pacer spaces one
// bucket's identifies across nodes only if each goes out by then, and the
// dial queue, TLS, Hello and a stall of the process (CPU starvation, a
// short SIGSTOP) all fall between the grant and the write. Past it, the
// slot's start is given back, once, and the attempt fails; the shard asks
// for a new slot.
func (c *conn) identifyLate() *connError {
	if c.a.IdentifyBy == 0 || clock.Mono(c.t.clock) < c.a.IdentifyBy {
		return nil
	}
	if c.a.SlotUnused != nil && !c.slotBack.Swap(true) {
		c.a.SlotUnused()
	}
	c.t.log.Warn("gateway: identify slot's deadline passed before the identify; not sent, slot given back", "shard", c.a.Shard,
		"late", clock.Mono(c.t.clock)-c.a.IdentifyBy)
	return &connError{class: core.Transient, fault: faultStalled, err: errIdentifyLate}
}
