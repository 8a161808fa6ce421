package gatewaysim

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// guildBase is the timestamp part (milliseconds after Discord's epoch, mid
// 2024) of the first guild id, so that ids look like real snowflakes.
const guildBase = 300_000_000_000

// discordEpoch is the first millisecond of 2015, in Unix milliseconds.
const discordEpoch = 1420070400000

var botUserID = uint64(guildBase-1000) << 22

// GuildID is the snowflake of the bot's k-th guild, k from 1 to
// Config.Guilds.
func GuildID(k int) uint64 { return uint64(guildBase+k) << 22 }

// ShardOf routes a guild to its shard: (guild_id >> 22) % total.
func ShardOf(guildID uint64, total int) int { return int((guildID >> 22) % uint64(total)) }

// firstGuild returns the smallest k ≥ 1 whose guild is on shardID of total.
func firstGuild(shardID, total int) int {
	k := ((shardID-guildBase%total)%total + total) % total
	if k == 0 {
		k = total
	}
	return k
}

// guildCount is the number of the bot's guilds on shardID of total.
func (s *Server) guildCount(shardID, total int) int {
	k := firstGuild(shardID, total)
	guilds := int(s.guilds.Load())
	if k > guilds {
		return 0
	}
	return (guilds-k)/total + 1
}

func (s *Server) eachGuild(shardID, total int, f func(uint64)) {
	for k, guilds := firstGuild(shardID, total), int(s.guilds.Load()); k <= guilds; k += total {
		f(GuildID(k))
	}
}

// Guilds lists the guild ids that a session of shardID of total receives.
func (s *Server) Guilds(shardID, total int) []uint64 {
	var out []uint64
	s.eachGuild(shardID, total, func(g uint64) { out = append(out, g) })
	return out
}

func guildCreateData(g uint64) []byte {
	id := strconv.AppendUint(nil, g, 10)
	b := make([]byte, 0, 512)
	b = append(b, `{"id":"`...)
	b = append(b, id...)
	b = append(b, `","name":"guild `...)
	b = strconv.AppendUint(b, g>>22-guildBase, 10)
	b = append(b, `","owner_id":"`...)
	b = strconv.AppendUint(b, botUserID, 10)
	b = append(b, `","unavailable":false,"large":false,"member_count":2,"channels":[{"id":"`...)
	b = strconv.AppendUint(b, g+1, 10)
	// Every field Discord's guild text channel and role always carry:
	// discord.py reads position, color and the rest without a default.
	b = append(b, `","type":0,"name":"general","position":0,"permission_overwrites":[],"nsfw":false,"parent_id":null,"topic":null,"last_message_id":null,"rate_limit_per_user":0,"guild_id":"`...)
	b = append(b, id...)
	b = append(b, `"}],"roles":[{"id":"`...)
	b = append(b, id...)
	b = append(b, `","name":"@everyone","permissions":"0","color":0,"hoist":false,"icon":null,"unicode_emoji":null,"position":0,"managed":false,"mentionable":false,"flags":0}],"members":[],"presences":[],"voice_states":[],"threads":[],"emojis":[],"stickers":[]}`...)
	return b
}

const filler = "The quick brown fox jumps over the lazy dog while the gateway keeps every shard alive. "

// messageData builds a MESSAGE_CREATE d of about size bytes in guild g, or a
// direct message when g is zero.
func (s *Server) messageData(g uint64, size int) []byte {
	s.nextID++
	now := s.clock.Now().UnixMilli() - discordEpoch
	msgID := uint64(max(now, 0))<<22 | s.nextID&(1<<22-1)
	author := uint64(guildBase-2000+s.rng.IntN(1000)) << 22
	b := make([]byte, 0, max(size, 256)+32)
	b = append(b, `{"id":"`...)
	b = strconv.AppendUint(b, msgID, 10)
	b = append(b, `","channel_id":"`...)
	if g != 0 {
		b = strconv.AppendUint(b, g+1, 10)
		b = append(b, `","guild_id":"`...)
		b = strconv.AppendUint(b, g, 10)
	} else {
		b = strconv.AppendUint(b, author+1, 10)
	}
	b = append(b, `","author":{"id":"`...)
	b = strconv.AppendUint(b, author, 10)
	b = append(b, `","username":"user`...)
	b = strconv.AppendUint(b, author>>22-guildBase+2000, 10)
	b = append(b, `","discriminator":"0","global_name":null,"avatar":null,"bot":false},"timestamp":"`...)
	b = s.clock.Now().UTC().AppendFormat(b, "2006-01-02T15:04:05.000000+00:00")
	b = append(b, `","edited_timestamp":null,"tts":false,"mention_everyone":false,"mentions":[],"mention_roles":[],"attachments":[],"embeds":[],"pinned":false,"type":0,"content":"`...)
	for pad := size - len(b) - 2; pad > 0; {
		n := min(pad, len(filler))
		b = append(b, filler[:n]...)
		pad -= n
	}
	return append(b, `"}`...)
}

// Event is one dispatch published to a shard.
type Event struct {
	// Name is the dispatch name (t), e.g. MESSAGE_CREATE: upper case
	// letters, digits and underscores.
	Name string
	// Data is the dispatch data (d); nil means {}.
	Data json.RawMessage
	// Unretained keeps the event out of replay buffers (Fluxer only), so
	// that a resume after it sees a sequence gap.
	Unretained bool
}

var errBadEvent = errors.New("gatewaysim: event name must be upper case letters, digits and underscores, and data valid JSON")

// Publish sends ev to every live or resumable session of a shard id and
// returns how many sessions it was sequenced into.
func (s *Server) Publish(shardID int, ev Event) (int, error) {
	data, err := checkEvent(ev)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.changes.notify()
	sh := s.shards[shardID]
	if sh == nil {
		return 0, nil
	}
	return s.deliverLocked(sh, 0, ev.Name, data, 0, s.retainLocked(ev)), nil
}

// PublishGuild sends ev to every session whose shard the guild routes to,
// whatever its total, and returns how many sessions it reached.
func (s *Server) PublishGuild(guildID uint64, ev Event) (int, error) {
	data, err := checkEvent(ev)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.changes.notify()
	retain := s.retainLocked(ev)
	n := 0
	for _, sh := range s.shards {
		reached := 0
		for _, sess := range sh.sessions {
			if ShardOf(guildID, sess.total) == sh.id {
				s.sequenceLocked(sess, ev.Name, data, retain)
				reached++
			}
		}
		if reached > 0 {
			sh.published.Add(1)
		}
		n += reached
	}
	return n, nil
}

func checkEvent(ev Event) ([]byte, error) {
	if !validEventName(ev.Name) {
		return nil, errBadEvent
	}
	if ev.Data == nil {
		return []byte("{}"), nil
	}
	if !json.Valid(ev.Data) {
		return nil, errBadEvent
	}
	return append([]byte(nil), ev.Data...), nil
}

// retainLocked decides whether an event is kept for replay: always on
// Discord; on Fluxer unless it is marked, named in UnretainedEvents, or
// falls on UnretainedEvery. s.mu must be held.
func (s *Server) retainLocked(ev Event) bool {
	s.published++
	if s.cfg.Flavor != Fluxer {
		return true
	}
	if ev.Unretained || s.unretained[ev.Name] {
		return false
	}
	return s.cfg.UnretainedEvery <= 0 || s.published%int64(s.cfg.UnretainedEvery) != 0
}

// deliverLocked sequences one event into the sessions of a shard: those of
// the given total (0 for all) that have the required intent (Discord).
func (s *Server) deliverLocked(sh *shard, total int, name string, data []byte, intent uint64, retain bool) int {
	n := 0
	for _, sess := range sh.sessions {
		if total != 0 && sess.total != total {
			continue
		}
		if intent != 0 && s.cfg.Flavor == Discord && sess.intents&intent == 0 {
			continue
		}
		s.sequenceLocked(sess, name, data, retain)
		n++
	}
	sh.published.Add(1)
	return n
}

// Flood pushes n MESSAGE_CREATE events to every live session of a shard id,
// each as fast as its connection takes them, for throughput measurements.
// The events share one payload and are retained like any other. It returns
// the number of sessions flooded.
func (s *Server) Flood(shardID, n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.shards[shardID]
	if sh == nil || n <= 0 {
		return 0
	}
	size := s.traffic.cfg.PayloadSize
	if size <= 0 {
		size = defaultPayloadSize
	}
	count := 0
	for _, sess := range sh.sessions {
		c := sess.conn
		if c == nil {
			continue
		}
		var g uint64
		if guilds := s.guildCount(sh.id, sess.total); guilds > 0 {
			g = GuildID(firstGuild(sh.id, sess.total))
		}
		data := s.messageData(g, size)
		c.wmu.Lock()
		c.flood += n
		c.floodData = data
		c.kickLocked()
		c.wmu.Unlock()
		count++
	}
	return count
}

// floodBatch sequences the next events of a flooded connection; it runs in
// the connection's writer once the queue is empty.
func (s *Server) floodBatch(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := c.sess
	c.wmu.Lock()
	n := min(c.flood, 64)
	if sess == nil || c.closing {
		n = 0
		c.flood = 0
	}
	c.flood -= n
	data := c.floodData
	c.wmu.Unlock()
	for range n {
		s.sequenceLocked(sess, "MESSAGE_CREATE", data, true)
	}
	if n > 0 {
		sess.sh.published.Add(int64(n))
	}
}

const defaultPayloadSize = 700

// Traffic is the event load the simulator generates. Guild messages go to
// the shard of their guild, direct messages to shard 0; on Discord a
// session receives them only with the GUILD_MESSAGES or DIRECT_MESSAGES
// intent.
type Traffic struct {
	// PerShard is MESSAGE_CREATE events per second for every shard that has
	// sessions.
	PerShard float64
	// Global is MESSAGE_CREATE events per second spread at random over the
	// shards that have sessions.
	Global float64
	// DirectMessages is direct-message MESSAGE_CREATE events per second,
	// all on shard 0.
	DirectMessages float64
	// PayloadSize is the approximate size of each event's d in bytes;
	// default 700.
	PayloadSize int
	// Tick is how often the generator runs; default 100 ms.
	Tick time.Duration
}

type trafficState struct {
	cfg       Traffic
	timer     clock.Timer
	last      time.Time
	globalAcc float64
	dmAcc     float64
}

// SetTraffic replaces the generated load; the zero Traffic stops it.
func (s *Server) SetTraffic(t Traffic) {
	if t.PayloadSize <= 0 {
		t.PayloadSize = defaultPayloadSize
	}
	if t.Tick <= 0 {
		t.Tick = 100 * time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.traffic.cfg = t
	s.traffic.last = s.clock.Now()
	active := t.PerShard > 0 || t.Global > 0 || t.DirectMessages > 0
	switch {
	case active && s.traffic.timer == nil:
		s.traffic.timer = s.after(t.Tick, s.trafficTick)
	case active:
		s.traffic.timer.Reset(t.Tick)
	case s.traffic.timer != nil:
		s.traffic.timer.Stop()
		s.traffic.timer = nil
	}
}

// trafficTick generates the events owed since the last tick. One timer
// serves every shard, so the cost of a tick grows with the shards that have
// sessions, not with a goroutine or timer per shard.
func (s *Server) trafficTick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.traffic
	if t.timer == nil {
		return
	}
	now := s.clock.Now()
	sec := now.Sub(t.last).Seconds()
	t.last = now
	cfg := t.cfg
	if cfg.PerShard > 0 {
		for _, sh := range s.shardList {
			if len(sh.sessions) == 0 {
				sh.acc = 0
				continue
			}
			sh.acc += cfg.PerShard * sec
			for n := owed(&sh.acc); n > 0; n-- {
				s.guildMessageLocked(sh, cfg.PayloadSize)
			}
		}
	}
	if cfg.Global > 0 {
		t.globalAcc += cfg.Global * sec
		if n := owed(&t.globalAcc); n > 0 {
			var active []*shard
			for _, sh := range s.shardList {
				if len(sh.sessions) > 0 {
					active = append(active, sh)
				}
			}
			for ; n > 0 && len(active) > 0; n-- {
				s.guildMessageLocked(active[s.rng.IntN(len(active))], cfg.PayloadSize)
			}
		}
	}
	if cfg.DirectMessages > 0 {
		t.dmAcc += cfg.DirectMessages * sec
		for n := owed(&t.dmAcc); n > 0; n-- {
			if sh := s.shards[0]; sh != nil && len(sh.sessions) > 0 {
				s.deliverLocked(sh, 0, "MESSAGE_CREATE", s.messageData(0, cfg.PayloadSize), IntentDirectMessages, s.retainLocked(Event{Name: "MESSAGE_CREATE"}))
			}
		}
	}
	t.timer.Reset(cfg.Tick)
	s.changes.notify()
}

// owed takes the whole events out of an accumulator. The tolerance keeps
// ten ticks of 0.1 from summing to 0.999… and losing an event.
func owed(acc *float64) int {
	n := int(*acc + 1e-9)
	*acc = max(*acc-float64(n), 0)
	return n
}

// guildMessageLocked generates one guild message for a shard: for each
// total its sessions use, in a random guild routed to it.
func (s *Server) guildMessageLocked(sh *shard, size int) {
	var totals [4]int
	seen := totals[:0]
	for _, sess := range sh.sessions {
		dup := false
		for _, t := range seen {
			dup = dup || t == sess.total
		}
		if dup {
			continue
		}
		seen = append(seen, sess.total)
		n := s.guildCount(sh.id, sess.total)
		if n == 0 {
			continue
		}
		k := firstGuild(sh.id, sess.total) + s.rng.IntN(n)*sess.total
		data := s.messageData(GuildID(k), size)
		s.deliverLocked(sh, sess.total, "MESSAGE_CREATE", data, IntentGuildMessages, s.retainLocked(Event{Name: "MESSAGE_CREATE"}))
	}
}
