package relay

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
)

// ErrUnknownClient is Kick's answer for a client id the relay does not
// have.
var ErrUnknownClient = errors.New("no such relay client")

// Kick ends a client's session and closes its connection with 4000: the
// client's resume gets op 9, and it identifies anew.
func (s *Server) Kick(client int) error {
	s.mu.Lock()
	sess := s.clients[client]
	if sess == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrUnknownClient, client)
	}
	c := sess.conn
	s.endSessionLocked(sess, "kicked by the operator")
	s.mu.Unlock()
	if c != nil {
		c.closeWith(4000, "kicked by the operator", false)
	}
	return nil
}

// Status is the content of /relay: key value lines.
func (s *Server) Status() []byte {
	s.mu.Lock()
	var addrs []string
	for _, l := range s.listeners {
		addrs = append(addrs, l.Addr().String())
	}
	attached := 0
	for _, sess := range s.sessions {
		if sess.conn != nil {
			attached++
		}
	}
	n := len(s.sessions)
	s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "listeners %s\n", orNone(strings.Join(addrs, " ")))
	fmt.Fprintf(&b, "clients %d\nconnected %d\n", n, attached)
	fmt.Fprintf(&b, "resume_window %v\n", s.cfg.ResumeWindow)
	var kinds []string
	for _, k := range Kinds {
		if s.kinds[k] {
			kinds = append(kinds, k)
		}
	}
	fmt.Fprintf(&b, "cache %s\n", orNone(strings.Join(kinds, ",")))
	for _, k := range Kinds {
		if s.kinds[k] {
			fmt.Fprintf(&b, "cache_bytes_%s %d\n", k, s.bytes.perKind[k].Load())
		}
	}
	fmt.Fprintf(&b, "cache_bytes %d\ncache_limit %d\ncache_refused %d\n", s.bytes.total.Load(), s.bytes.limit, s.bytes.refused.Load())
	return []byte(b.String())
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// ClientInfo is one line of /clients.
type ClientInfo struct {
	ID           int
	Shard        int
	Remote       string // "-" while detached
	IdentifiedAt time.Time
	Seq          int64
	Lag          uint64 // dispatch lines of the shard the client has not read
	Events       uint64
	Resumes      uint64
}

// Clients lists the clients' sessions in id order.
func (s *Server) Clients() []ClientInfo {
	s.mu.Lock()
	list := make([]*session, 0, len(s.clients))
	remote := map[*session]string{}
	for _, sess := range s.clients {
		list = append(list, sess)
		remote[sess] = "-"
		if sess.conn != nil {
			remote[sess] = sess.remote
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b *session) int { return a.client - b.client })
	out := make([]ClientInfo, 0, len(list))
	for _, sess := range list {
		sess.log.mu.Lock()
		total := sess.log.lines
		sess.log.mu.Unlock()
		sess.mu.Lock()
		ci := ClientInfo{ID: sess.client, Shard: sess.shard, Remote: remote[sess], IdentifiedAt: sess.identifiedAt,
			Seq: sess.seq, Events: sess.events, Resumes: sess.resumes}
		if total > sess.cursor.lines {
			ci.Lag = total - sess.cursor.lines
		}
		sess.mu.Unlock()
		out = append(out, ci)
	}
	return out
}

// ClientsText is the content of /clients: one line per client,
// id shard remote identified_at seq lag_events.
func (s *Server) ClientsText() []byte {
	var b []byte
	for _, c := range s.Clients() {
		b = strconv.AppendInt(b, int64(c.ID), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(c.Shard), 10)
		b = append(b, ' ')
		b = append(b, c.Remote...)
		b = append(b, ' ')
		b = append(b, c.IdentifiedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, c.Seq, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, c.Lag, 10)
		b = append(b, '\n')
	}
	return b
}

// Usage is the node ctl command the relay adds.
const Usage = "kick CLIENT_ID\n"

// Command runs a line written to the node's /ctl if it is a kick
// (handled false otherwise, for the core).
func (s *Server) Command(line string) (handled bool, err error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "kick" {
		return false, nil
	}
	id, convErr := strconv.Atoi(strings.Join(f[1:], " "))
	if len(f) != 2 || convErr != nil {
		return true, fmt.Errorf("%w: %q: want one client id (the first word of a /clients line); usage: %s", core.ErrUsage, line, strings.TrimSpace(Usage))
	}
	if err := s.Kick(id); err != nil {
		return true, fmt.Errorf("%w: %w", core.ErrUsage, err)
	}
	return true, nil
}
