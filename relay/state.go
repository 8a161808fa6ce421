package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardfs/shardfs/journal"
)

// dispatchLog is what the relay reads a shard's dispatches from: the
// shard's journal, after a restart with saved state the saved tail
// followed by the journal (see chain).
type dispatchLog interface {
	ReadAt(p []byte, off int64) (n int, start int64)
	Size() int64
	Oldest() int64
	Notify() <-chan struct{}
}

// chain is the saved tail of a shard's dispatches before a restart
// followed by the new process's journal of the shard, as one log: the
// tail at offsets [0, len(tail)), the journal after it. A client that
// resumes after the restart reads the tail from where it was, then what
// the shard got since, without a gap or a double.
type chain struct {
	tail []byte
	log  *journal.Log
}

func (c *chain) ReadAt(p []byte, off int64) (int, int64) {
	t := int64(len(c.tail))
	if c.log.Oldest() > 0 && off < t+c.log.Oldest() {
		// The journal dropped its first lines: the tail is no longer
		// followed by what came after it.
		off = max(off, t+c.log.Oldest())
	}
	if off < t {
		return copy(p, c.tail[off:]), off // the tail ends at a line's end
	}
	n, start := c.log.ReadAt(p, off-t)
	return n, start + t
}

func (c *chain) Size() int64 { return int64(len(c.tail)) + c.log.Size() }

func (c *chain) Oldest() int64 {
	if o := c.log.Oldest(); o > 0 {
		return int64(len(c.tail)) + o
	}
	return 0
}

func (c *chain) Notify() <-chan struct{} { return c.log.Notify() }

// The saved state: what a clean stop writes and the next start reads.
type savedState struct {
	Version  int
	SavedAt  time.Time
	Total    int
	NextID   int
	Shards   []savedShard
	Sessions []savedSession
}

type savedShard struct {
	ID     int
	Tail   []byte // the shard's dispatch lines from TailAt to the end
	TailAt int64
	Ready  map[string]json.RawMessage
	UserID string
	Order  []string
	Guilds map[string]savedGuild
}

type savedGuild struct {
	Fields      map[string]json.RawMessage
	Unavailable bool
	Coll        map[string]map[string]json.RawMessage
}

type savedSession struct {
	ID                       string
	Client, Shard            int
	Intents                  uint64
	UserID                   string
	IdentifiedAt, DetachedAt time.Time
	Seq, Base                int64
	Offs                     []int64
	Events, Resumes          uint64
}

const stateVersion = 1

// Save writes the relay's cache, a tail of each shard's dispatches and
// the client sessions to w, for Config.State of the next process. Call it
// after Close, once the shards have stopped (the node's clean stop), so
// that the tail ends where the shards' saved sessions do. The session
// ids it writes are secrets, like the shards' own.
func (s *Server) Save(w io.Writer) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if !closed {
		return errors.New("relay: Save before Close")
	}
	p := s.current()
	st := savedState{Version: stateVersion, SavedAt: s.clock.Now(), Total: p.total, NextID: s.nextID}
	for _, id := range p.ids {
		c := p.shards[id]
		c.mu.Lock()
		c.readAll() // what came after the follower stopped
		ss := savedShard{ID: id, Ready: c.ready, UserID: c.userID, Order: c.order, Guilds: map[string]savedGuild{}}
		for gid, g := range c.guilds {
			ss.Guilds[gid] = savedGuild{Fields: g.fields, Unavailable: g.unavailable, Coll: g.coll}
		}
		ss.TailAt = c.log.Oldest()
		ss.Tail = make([]byte, c.log.Size()-ss.TailAt)
		n, start := c.log.ReadAt(ss.Tail, ss.TailAt)
		ss.Tail, ss.TailAt = ss.Tail[:n], start
		c.mu.Unlock()
		st.Shards = append(st.Shards, ss)
	}
	s.mu.Lock()
	for _, sess := range s.sessions {
		sess.mu.Lock()
		sv := savedSession{ID: sess.id, Client: sess.client, Shard: sess.shard, Intents: sess.intents, UserID: sess.userID,
			IdentifiedAt: sess.identifiedAt, DetachedAt: sess.detachedAt, Seq: sess.seq, Base: sess.base,
			Events: sess.events, Resumes: sess.resumes}
		for _, m := range sess.offs {
			sv.Offs = append(sv.Offs, m.off)
		}
		sess.mu.Unlock()
		if sv.DetachedAt.IsZero() {
			sv.DetachedAt = st.SavedAt
		}
		st.Sessions = append(st.Sessions, sv)
	}
	s.mu.Unlock()
	return json.NewEncoder(w).Encode(st)
}

// load restores what Save wrote, before the followers start. The cache
// of each shard picks up at the end of its tail; a session's marks that
// fall before the tail are dropped (a resume from there gets op 9).
func (s *Server) load(r io.Reader) error {
	var st savedState
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return fmt.Errorf("relay state: %w", err)
	}
	p := s.current()
	if st.Version != stateVersion || st.Total != p.total {
		return fmt.Errorf("relay state of version %d for a total of %d; this relay has version %d and a total of %d", st.Version, st.Total, stateVersion, p.total)
	}
	tails := map[int]int64{}
	for _, ss := range st.Shards {
		c := p.shards[ss.ID]
		if c == nil {
			continue
		}
		c.log = &chain{tail: ss.Tail, log: c.log.(*journal.Log)}
		c.rd.off = int64(len(ss.Tail))
		tails[ss.ID] = ss.TailAt
		c.ready, c.userID, c.order = ss.Ready, ss.UserID, ss.Order
		for gid, g := range ss.Guilds {
			c.guilds[gid] = &guild{fields: g.Fields, unavailable: g.Unavailable, coll: g.Coll}
			for _, v := range g.Fields {
				s.bytes.add(KindGuilds, len(v))
			}
			for field, m := range g.Coll {
				for _, e := range m {
					s.bytes.add(kindOf(field), len(e))
				}
			}
		}
	}
	s.nextID = st.NextID
	for _, sv := range st.Sessions {
		c := p.shards[sv.Shard]
		at, ok := tails[sv.Shard]
		if c == nil || !ok {
			continue
		}
		sess := &session{id: sv.ID, client: sv.Client, shard: sv.Shard, intents: sv.Intents, userID: sv.UserID,
			identifiedAt: sv.IdentifiedAt, detachedAt: sv.DetachedAt, log: c, plan: p, remote: "-",
			seq: sv.Seq, base: sv.Base, events: sv.Events, resumes: sv.Resumes}
		sess.noContent = !s.fluxer() && sess.intents&intentMessageContent == 0
		for _, off := range sv.Offs {
			if off < at {
				sess.base++
				continue
			}
			sess.offs = append(sess.offs, mark{off: off - at})
		}
		s.sessions[sess.id] = sess
		s.clients[sess.client] = sess
		s.nextID = max(s.nextID, sess.client)
	}
	return nil
}
