package relay

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Cache kinds (--relay-cache). "guilds" is a guild's own fields (with its
// emojis, stickers and the rest of GUILD_CREATE that no other kind
// holds); the others are the arrays of GUILD_CREATE that change by their
// own events.
const (
	KindGuilds      = "guilds"
	KindChannels    = "channels" // channels and threads
	KindRoles       = "roles"
	KindMembers     = "members"
	KindVoiceStates = "voice_states"
	KindPresences   = "presences"
)

// Kinds lists every cache kind, in the order /relay shows them.
var Kinds = []string{KindGuilds, KindChannels, KindRoles, KindMembers, KindVoiceStates, KindPresences}

// DefaultKinds is what the cache holds unless --relay-cache says
// otherwise: what a READY and GUILD_CREATEs need so that discord.js and
// discord.py build their guilds, without presences, the largest kind.
var DefaultKinds = []string{KindGuilds, KindChannels, KindRoles, KindMembers, KindVoiceStates}

// collections are the arrays of a GUILD_CREATE the cache keeps by id, with
// the kind that holds them and the key of an element.
var collections = []struct{ field, kind, key string }{
	{"channels", KindChannels, "id"},
	{"threads", KindChannels, "id"},
	{"roles", KindRoles, "id"},
	{"members", KindMembers, "user.id"},
	{"voice_states", KindVoiceStates, "user_id"},
	{"presences", KindPresences, "user.id"},
}

// guild is one cached guild.
type guild struct {
	fields      map[string]json.RawMessage // top level, but for the collections
	unavailable bool
	coll        map[string]map[string]json.RawMessage // field → key → element
}

// shardCache follows one shard's dispatch journal and keeps what a READY
// and the GUILD_CREATEs are made from. The follower goroutine is its only
// writer.
type shardCache struct {
	id    int
	log   dispatchLog
	kinds map[string]bool
	bytes *cacheBytes

	mu     sync.Mutex
	rd     lineReader // the offset the cache reflects
	lines  uint64     // lines read
	ready  map[string]json.RawMessage
	userID string
	guilds map[string]*guild
	order  []string      // guild ids in READY/GUILD_CREATE order
	lost   uint64        // lines the follower lost to the journal's retention
	moved  chan struct{} // closed when the follower has read more
}

// notify returns a channel closed once the cache has read more of the
// journal: a client waiting for the shard's READY waits on the cache, not
// on the journal the cache may not have read yet.
func (c *shardCache) notify() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.moved == nil {
		c.moved = make(chan struct{})
	}
	return c.moved
}

// cacheBytes counts the cache's bytes per kind across shards, bounded.
type cacheBytes struct {
	limit   int64
	total   atomic.Int64
	perKind map[string]*atomic.Int64
	refused atomic.Int64 // elements not cached for the bound
}

func newCacheBytes(limit int64) *cacheBytes {
	c := &cacheBytes{limit: limit, perKind: map[string]*atomic.Int64{}}
	for _, k := range Kinds {
		c.perKind[k] = new(atomic.Int64)
	}
	return c
}

// add counts n more bytes of kind (negative: fewer); it refuses growth
// past the bound.
func (c *cacheBytes) add(kind string, n int) bool {
	if n > 0 && c.limit > 0 && c.total.Load()+int64(n) > c.limit {
		c.refused.Add(1)
		return false
	}
	c.total.Add(int64(n))
	c.perKind[kind].Add(int64(n))
	return true
}

func newShardCache(id int, log dispatchLog, kinds map[string]bool, bytes *cacheBytes) *shardCache {
	return &shardCache{id: id, log: log, kinds: kinds, bytes: bytes, guilds: map[string]*guild{}}
}

// follow reads the journal until done closes.
func (c *shardCache) follow(done <-chan struct{}) {
	for {
		ch := c.log.Notify()
		c.mu.Lock()
		lines := c.readLocked()
		if len(lines) > 0 && c.moved != nil {
			close(c.moved)
			c.moved = nil
		}
		c.mu.Unlock()
		if len(lines) > 0 {
			continue
		}
		select {
		case <-done:
			return
		case <-ch:
		}
	}
}

// readLocked applies the next lines of the journal, and returns them.
func (c *shardCache) readLocked() []byte {
	lines, lost := c.rd.next(c.log)
	if lost {
		c.lost++
	}
	eachLine(lines, func(line []byte) {
		c.lines++
		if e, ok := parseLine(line); ok {
			c.apply(string(e.t), e.d)
		}
	})
	return lines
}

// readAll applies the rest of the journal; with c.mu held.
func (c *shardCache) readAll() {
	for len(c.readLocked()) > 0 { // until nothing is left
	}
}

// apply updates the cache with one dispatch.
func (c *shardCache) apply(t string, d []byte) {
	switch t {
	case "READY":
		var r map[string]json.RawMessage
		if json.Unmarshal(d, &r) != nil {
			return
		}
		var u struct{ ID string }
		json.Unmarshal(r["user"], &u)
		var gs []struct{ ID string }
		json.Unmarshal(r["guilds"], &gs)
		c.ready, c.userID = r, u.ID
		keep := map[string]bool{}
		for _, g := range gs {
			keep[g.ID] = true
			if c.guilds[g.ID] == nil {
				c.guilds[g.ID] = &guild{unavailable: true}
				c.order = append(c.order, g.ID)
			}
		}
		for id := range c.guilds {
			if !keep[id] {
				c.removeGuild(id)
			}
		}
	case "GUILD_CREATE", "GUILD_UPDATE":
		var f map[string]json.RawMessage
		if json.Unmarshal(d, &f) != nil {
			return
		}
		var id string
		json.Unmarshal(f["id"], &id)
		g := c.guilds[id]
		if g == nil {
			g = &guild{}
			c.guilds[id] = g
			c.order = append(c.order, id)
		}
		if t == "GUILD_CREATE" {
			c.clearGuild(g)
			var un bool
			json.Unmarshal(f["unavailable"], &un)
			g.unavailable = un
		}
		for _, col := range collections {
			raw, ok := f[col.field]
			delete(f, col.field)
			if !ok {
				continue
			}
			var elems []json.RawMessage
			json.Unmarshal(raw, &elems)
			for _, e := range elems {
				c.put(g, col.field, col.kind, keyOf(e, col.key), e)
			}
		}
		if !c.kinds[KindGuilds] {
			f = map[string]json.RawMessage{"id": f["id"]}
		}
		for k, v := range f {
			if old, ok := g.fields[k]; ok {
				c.bytes.add(KindGuilds, -len(old))
			}
			if g.fields == nil {
				g.fields = map[string]json.RawMessage{}
			}
			g.fields[k] = v
			c.bytes.add(KindGuilds, len(v))
		}
	case "GUILD_DELETE":
		var gd struct {
			ID          string `json:"id"`
			Unavailable bool   `json:"unavailable"`
		}
		if json.Unmarshal(d, &gd) != nil || c.guilds[gd.ID] == nil {
			return
		}
		if gd.Unavailable {
			c.guilds[gd.ID].unavailable = true
			return
		}
		c.removeGuild(gd.ID)
	case "CHANNEL_CREATE", "CHANNEL_UPDATE", "THREAD_CREATE", "THREAD_UPDATE":
		c.element(d, strings.ToLower(strings.SplitN(t, "_", 2)[0])+"s", "id", false)
	case "CHANNEL_DELETE", "THREAD_DELETE":
		c.element(d, strings.ToLower(strings.SplitN(t, "_", 2)[0])+"s", "id", true)
	case "GUILD_ROLE_CREATE", "GUILD_ROLE_UPDATE":
		var r struct {
			GuildID string          `json:"guild_id"`
			Role    json.RawMessage `json:"role"`
		}
		if json.Unmarshal(d, &r) == nil && c.guilds[r.GuildID] != nil {
			c.put(c.guilds[r.GuildID], "roles", KindRoles, keyOf(r.Role, "id"), r.Role)
		}
	case "GUILD_ROLE_DELETE":
		var r struct {
			GuildID string `json:"guild_id"`
			RoleID  string `json:"role_id"`
		}
		if json.Unmarshal(d, &r) == nil && c.guilds[r.GuildID] != nil {
			c.drop(c.guilds[r.GuildID], "roles", KindRoles, r.RoleID)
		}
	case "GUILD_MEMBER_ADD", "GUILD_MEMBER_UPDATE":
		c.element(d, "members", "user.id", false)
	case "GUILD_MEMBER_REMOVE":
		c.element(d, "members", "user.id", true)
	case "GUILD_MEMBERS_CHUNK":
		var ch struct {
			GuildID string            `json:"guild_id"`
			Members []json.RawMessage `json:"members"`
		}
		if json.Unmarshal(d, &ch) == nil && c.guilds[ch.GuildID] != nil {
			for _, m := range ch.Members {
				c.put(c.guilds[ch.GuildID], "members", KindMembers, keyOf(m, "user.id"), m)
			}
		}
	case "VOICE_STATE_UPDATE":
		var v struct {
			ChannelID *string `json:"channel_id"`
		}
		json.Unmarshal(d, &v)
		c.element(d, "voice_states", "user_id", v.ChannelID == nil)
	case "PRESENCE_UPDATE":
		c.element(d, "presences", "user.id", false)
	case "GUILD_EMOJIS_UPDATE", "GUILD_STICKERS_UPDATE":
		field := "emojis"
		if t == "GUILD_STICKERS_UPDATE" {
			field = "stickers"
		}
		var f map[string]json.RawMessage
		if json.Unmarshal(d, &f) != nil {
			return
		}
		var id string
		json.Unmarshal(f["guild_id"], &id)
		if g := c.guilds[id]; g != nil && c.kinds[KindGuilds] && g.fields != nil {
			c.bytes.add(KindGuilds, len(f[field])-len(g.fields[field]))
			g.fields[field] = f[field]
		}
	}
}

// element puts (or drops) d, an element of the collection field of the
// guild named by its guild_id.
func (c *shardCache) element(d []byte, field, key string, remove bool) {
	var gid struct {
		GuildID string `json:"guild_id"`
	}
	if json.Unmarshal(d, &gid) != nil {
		return
	}
	g := c.guilds[gid.GuildID]
	if g == nil {
		return // a direct message channel, or a guild not known yet
	}
	kind := kindOf(field)
	if remove {
		c.drop(g, field, kind, keyOf(d, key))
		return
	}
	c.put(g, field, kind, keyOf(d, key), d)
}

func kindOf(field string) string {
	for _, col := range collections {
		if col.field == field {
			return col.kind
		}
	}
	return KindGuilds
}

// put caches one element. The bot's own member is kept whatever the
// kinds, since libraries look up guild.members.me.
func (c *shardCache) put(g *guild, field, kind, key string, e json.RawMessage) {
	if key == "" || (!c.kinds[kind] && (field != "members" || key != c.userID)) {
		return
	}
	if g.coll == nil {
		g.coll = map[string]map[string]json.RawMessage{}
	}
	m := g.coll[field]
	if m == nil {
		m = map[string]json.RawMessage{}
		g.coll[field] = m
	}
	if !c.bytes.add(kind, len(e)-len(m[key])) {
		return
	}
	m[key] = slices.Clone(e) // e aliases the reader's buffer
}

func (c *shardCache) drop(g *guild, field, kind, key string) {
	if old, ok := g.coll[field][key]; ok {
		c.bytes.add(kind, -len(old))
		delete(g.coll[field], key)
	}
}

func (c *shardCache) clearGuild(g *guild) {
	for k, v := range g.fields {
		c.bytes.add(KindGuilds, -len(v))
		delete(g.fields, k)
	}
	for field, m := range g.coll {
		for key := range m {
			c.drop(g, field, kindOf(field), key)
		}
	}
}

// release gives back the bytes of a cache no longer followed (Replan).
func (c *shardCache) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.guilds {
		c.removeGuild(id)
	}
}

func (c *shardCache) removeGuild(id string) {
	if g := c.guilds[id]; g != nil {
		c.clearGuild(g)
	}
	delete(c.guilds, id)
	c.order = slices.DeleteFunc(c.order, func(o string) bool { return o == id })
}

// keyOf reads the element's key: a field, or a field of a nested object
// ("user.id").
func keyOf(e []byte, key string) string {
	outer, inner, nested := strings.Cut(key, ".")
	var f map[string]json.RawMessage
	if json.Unmarshal(e, &f) != nil {
		return ""
	}
	raw := f[outer]
	if nested {
		var g map[string]json.RawMessage
		if json.Unmarshal(raw, &g) != nil {
			return ""
		}
		raw = g[inner]
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// snapshot is what a new client gets: READY's d without the session's
// own fields, the GUILD_CREATE of each available guild, and the journal
// offset (and line count) the cache reflects.
type snapshot struct {
	ready        map[string]json.RawMessage
	guildIDs     []string
	guildCreates [][]byte
	offset       int64
	lines        uint64
	userID       string
}

// snapshot returns nil until the shard's READY was seen.
func (c *shardCache) snapshot() *snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ready == nil {
		return nil
	}
	s := &snapshot{ready: c.ready, offset: c.rd.off, lines: c.lines, userID: c.userID}
	for _, id := range c.order {
		g := c.guilds[id]
		s.guildIDs = append(s.guildIDs, id)
		if g.unavailable || g.fields == nil || !c.kinds[KindGuilds] {
			continue
		}
		out := make(map[string]json.RawMessage, len(g.fields)+len(collections))
		for k, v := range g.fields {
			out[k] = v
		}
		for _, col := range collections {
			elems := make([]json.RawMessage, 0, len(g.coll[col.field]))
			for _, e := range g.coll[col.field] {
				elems = append(elems, e)
			}
			out[col.field] = mustMarshal(elems)
		}
		out["unavailable"] = json.RawMessage("false")
		s.guildCreates = append(s.guildCreates, mustMarshal(out))
	}
	return s
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // raw messages that were valid JSON when cached
	}
	return b
}
