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
