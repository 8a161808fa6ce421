package gatewaysim

import (
	"net/http"
	"strconv"
)

// GuildListLimit is the most guilds one page of GET
// {api}/users/@me/guilds returns, and its default page size (Discord's
// documented maximum, which Fluxer's communities list shares).
const GuildListLimit = 200

// GuildListFault makes the guild list misbehave, for tests of a client
// that counts the bot's guilds page by page.
type GuildListFault struct {
	// FailAfter, when above 0, answers 500 to every page after the
	// first FailAfter pages of a count (a page asked with no "after").
	FailAfter int
	// Loop answers every page after the first with the first page again,
	// as a broken cursor would: the list never ends.
	Loop bool
}

// SetGuildListFault sets the fault of the guild list; the zero value
// clears it.
func (s *Server) SetGuildListFault(f GuildListFault) { s.guildPages.Store(&f) }

// SetShards changes the shard count discovery recommends (Discord's
// "shards"; Fluxer always answers 1) and, with ShardingRequired, the
// only total identify accepts.
func (s *Server) SetShards(n int) { s.recommended.Store(int64(max(n, 1))) }

// SetGuilds changes how many guilds the bot is in, as a bot that grows
// does. Every connected session with more than MaxGuildsPerShard guilds is
// then closed with 4011, as the gateway closes a shard that has outgrown
// its plan, and identifies of such shards close 4011 too. It returns how
// many connections it closed.
func (s *Server) SetGuilds(n int) int {
	s.guilds.Store(int64(max(n, 0)))
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.changes.notify()
	// Closing 4011 ends a session, which takes it out of sh.sessions:
	// pick the connections first.
	var over []*conn
	for _, sh := range s.shards {
		for _, sess := range sh.sessions {
			if c := sess.conn; c != nil && !c.finished && s.guildCount(sh.id, sess.total) > MaxGuildsPerShard {
				over = append(over, c)
			}
		}
	}
	for _, c := range over {
		c.closeLocked(CloseShardingRequired, "Sharding required.")
	}
	return len(over)
}

// serveGuildList answers GET {api}/users/@me/guilds: the bot's guilds
// (Fluxer: communities) in ascending id order, at most "limit" (1 to 200,
// default 200) of them after the id "after". A client counts the bot's
// guilds by asking page after page until one is short.
func (s *Server) serveGuildList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := GuildListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > GuildListLimit {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"message": "Invalid Form Body", "code": 50035}`))
			return
		}
		limit = n
	}
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"message": "Invalid Form Body", "code": 50035}`))
			return
		}
		after = n
	}
	// Guild k's id grows with k, so the page after an id starts at the
	// first k whose id is above it.
	first := 1
	if after >= GuildID(1) {
		first = int(after>>22) - guildBase + 1
	}
	if f := s.guildPages.Load(); f != nil && after != 0 {
		page := (first-1)/limit + 1 // pages asked so far, this one included
		switch {
		case f.Loop:
			first = 1
		case f.FailAfter > 0 && page > f.FailAfter:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"message": "500: Internal Server Error", "code": 0}`))
			return
		}
	}
	guilds := int(s.guilds.Load())
	b := []byte{'['}
	for k := first; k <= guilds && k < first+limit; k++ {
		if k > first {
			b = append(b, ',')
		}
		b = append(b, `{"id":"`...)
		b = strconv.AppendUint(b, GuildID(k), 10)
		b = append(b, `","name":"guild `...)
		b = strconv.AppendInt(b, int64(k), 10)
		b = append(b, `"}`...)
	}
	b = append(b, ']')
	_, _ = w.Write(b)
}
