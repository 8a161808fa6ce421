package soak

import (
	"fmt"
	"sync"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// frameLog keeps every client frame the simulator reports, with the node
// that sent it, found from the client's port through /proc while the
// connection is open (OnFrame runs before the server answers).
type frameLog struct {
	simPort int
	pids    func() map[int]string // running nodes: pid → name

	mu     sync.Mutex
	byConn map[uint64]string // connection → node ("" unknown)
	shard  map[uint64]int    // connection → the first shard it named
	frames []sentFrame
	// unknown counts frames whose sender was not found: a node that
	// exited between its send and the lookup.
	unknown int
}

type sentFrame struct {
	node  string
	conn  uint64
	shard int
	op    int
	code  int
	reply bool
	at    time.Time
}

func newFrameLog(simPort int, pids func() map[int]string) *frameLog {
	return &frameLog{simPort: simPort, pids: pids, byConn: map[uint64]string{}, shard: map[uint64]int{}}
}

// add is the simulator's OnFrame.
func (l *frameLog) add(f gatewaysim.Frame) {
	l.mu.Lock()
	node, known := l.byConn[f.Conn]
	l.mu.Unlock()
	if !known {
		owners := l.pids()
		pids := make([]int, 0, len(owners))
		for pid := range owners {
			pids = append(pids, pid)
		}
		if pid, err := socketOwner(portOf(f.Remote), l.simPort, pids); err == nil {
			node = owners[pid]
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byConn[f.Conn] = node
	if node == "" {
		l.unknown++
	}
	if _, ok := l.shard[f.Conn]; !ok && f.Shard >= 0 {
		l.shard[f.Conn] = f.Shard
	}
	l.frames = append(l.frames, sentFrame{node: node, conn: f.Conn, shard: f.Shard, op: f.Op, code: f.Code, reply: f.Reply, at: f.At})
}

// since returns the frames node sent at or after t, with the shard of
// frames that named none (a heartbeat before identify) taken from their
// connection.
func (l *frameLog) since(node string, t time.Time) []sentFrame {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []sentFrame
	for _, f := range l.frames {
		if f.node != node || f.at.Before(t) {
			continue
		}
		if f.shard < 0 {
			if sh, ok := l.shard[f.conn]; ok {
				f.shard = sh
			}
		}
		out = append(out, f)
	}
	return out
}

// all returns every frame, shards filled in as since does.
func (l *frameLog) all() []sentFrame {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]sentFrame, 0, len(l.frames))
	for _, f := range l.frames {
		if f.shard < 0 {
			if sh, ok := l.shard[f.conn]; ok {
				f.shard = sh
			}
		}
		out = append(out, f)
	}
	return out
}

func (f sentFrame) String() string {
	op := fmt.Sprintf("op %d", f.op)
	switch f.op {
	case gatewaysim.OpClose:
		op = fmt.Sprintf("close %d", f.code)
	case 1:
		op = "heartbeat"
	case 2:
		op = "identify"
	case 6:
		op = "resume"
	}
	return fmt.Sprintf("%s %s %s shard %d (conn %d)", f.at.Format("15:04:05.000"), f.node, op, f.shard, f.conn)
}
