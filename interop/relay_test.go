package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/node"
)

// relayIntents are the node's: guilds, members, voice states, guild
// messages, message content.
const relayIntents = 1 | 1<<1 | 1<<7 | 1<<9 | 1<<15

// relayRetention is each shard's dispatch retention in these tests: the
// relay's replay depth, and how far a client may lag before it is closed
// 4009. 1,000 messages of about 500 bytes published at once must fit,
// whatever a loaded machine does to a bot in another process.
const relayRetention = 8 << 20

// relayRig is a node with its relay in front of the simulator.
type relayRig struct {
	sim      *gatewaysim.Server
	node     *node.Node
	url      string // the relay's http:// base
	presence chan string
	msgID    int                    // the last message id published: discord.js drops a MESSAGE_CREATE whose id it has
	onFrame  func(gatewaysim.Frame) // set before the node starts
}

func newRelayRig(t *testing.T, rec *recorder) *relayRig {
	t.Helper()
	r := &relayRig{presence: make(chan string, 16)}
	r.sim = newSim(t, rec, func(c *gatewaysim.Config) {
		c.OnFrame = func(f gatewaysim.Frame) {
			if r.onFrame != nil {
				r.onFrame(f)
			}
			if f.Op == 3 {
				select {
				case r.presence <- strconv.Itoa(f.Shard):
				default:
				}
			}
		}
	})
	n, err := node.New(node.Config{Flavor: core.Discord, Token: token, GatewayURL: r.sim.GatewayURL(),
		Plan: core.Range(2, 0, 1), MaxConcurrency: 2, Intents: relayIntents, Relay: true, DispatchRetention: relayRetention})
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	n.Start()
	r.serve(t)
	return r
}

// serve serves the node's relay on a loopback port until the test ends.
func (r *relayRig) serve(t *testing.T) {
	t.Helper()
	n := r.node
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.url = "http://" + l.Addr().String()
	var wg sync.WaitGroup
	wg.Go(func() { n.Relay.Serve(l) })
	t.Cleanup(func() {
		n.Close()
		wg.Wait()
	})
}

// publishContent sends one MESSAGE_CREATE with content in a guild of
// shard.
func (r *relayRig) publishContent(t *testing.T, shard int, content string) {
	t.Helper()
	g := r.sim.Guilds(shard, 2)[0]
	r.msgID++
	d, _ := json.Marshal(map[string]any{"id": strconv.Itoa(1000000 + r.msgID), "channel_id": strconv.FormatUint(g+1, 10),
		"guild_id": strconv.FormatUint(g, 10), "content": content, "type": 0, "tts": false,
		"mention_everyone": false, "mentions": []any{}, "mention_roles": []any{}, "attachments": []any{}, "embeds": []any{},
		"pinned": false, "timestamp": "2026-12-07T07:00:00.000000+00:00", "edited_timestamp": nil,
		"author": map[string]any{"id": "5", "username": "u", "discriminator": "0", "avatar": nil}})
	if _, err := r.sim.Publish(shard, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: d}); err != nil {
		t.Fatal(err)
	}
}

// publish sends n MESSAGE_CREATEs with contents prefix0..prefixN-1 in a
// guild of shard.
func (r *relayRig) publish(t *testing.T, shard, n int, prefix string) {
	t.Helper()
	g := r.sim.Guilds(shard, 2)[0]
	for i := range n {
		r.msgID++
		d, _ := json.Marshal(map[string]any{"id": strconv.Itoa(1000000 + r.msgID), "channel_id": strconv.FormatUint(g+1, 10),
			"guild_id": strconv.FormatUint(g, 10), "content": prefix + strconv.Itoa(i), "type": 0, "tts": false,
			"mention_everyone": false, "mentions": []any{}, "mention_roles": []any{}, "attachments": []any{}, "embeds": []any{},
			"pinned": false, "timestamp": "2026-12-07T07:00:00.000000+00:00", "edited_timestamp": nil,
			"author": map[string]any{"id": "5", "username": "u", "discriminator": "0", "avatar": nil}})
		if _, err := r.sim.Publish(shard, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: d}); err != nil {
			t.Fatal(err)
		}
	}
}

// discordgo, unchanged but for its gateway endpoint, logs in through the
// relay, reports READY with its shard's guilds, gets 1,000
// MESSAGE_CREATEs in order, and its presence update reaches the shard's
// session at the simulator.
func TestDiscordgoThroughRelay(t *testing.T) {
	rec := newRecorder()
	captureDiscordgoLog(t, rec)
	r := newRelayRig(t, rec)
	discordgo.EndpointGateway = r.url + "/api/v10/gateway"
	s, err := discordgo.New("Bot " + token)
	if err != nil {
		t.Fatal(err)
	}
	s.ShardID, s.ShardCount = 1, 2
	s.Identify.Intents = relayIntents
	s.SyncEvents = true
	s.LogLevel = discordgo.LogWarning
	ready := make(chan int, 1)
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	s.AddHandler(func(_ *discordgo.Session, e *discordgo.Ready) { ready <- len(e.Guilds) })
	s.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageCreate) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, m.Content)
		if len(got) == 1000 {
			close(done)
		}
	})
	if err := s.Open(); err != nil {
		d, _ := r.node.Scheduler.Diag(1)
		t.Fatalf("%v (shard 1: %v, dispatch log %d bytes)", err, d.State, r.node.Tree.DispatchLog(1).Size())
	}
	defer s.Close()
	select {
	case n := <-ready:
		if want := len(r.sim.Guilds(1, 2)); n != want {
			t.Errorf("READY with %d guilds; want %d", n, want)
		}
	case <-time.After(wait):
		t.Fatal("no READY")
	}
	r.publish(t, 1, 1000, "m")
	select {
	case <-done:
	case <-time.After(wait):
		mu.Lock()
		t.Fatalf("got %d of 1,000 messages", len(got))
	}
	mu.Lock()
	for i, c := range got {
		if c != fmt.Sprintf("m%d", i) {
			t.Fatalf("message %d is %q; want m%d (in order, none missing)", i, c, i)
		}
	}
	mu.Unlock()
	if err := s.UpdateGameStatus(0, "relayed"); err != nil {
		t.Fatal(err)
	}
	select {
	case shard := <-r.presence:
		if shard != "1" {
			t.Errorf("presence update on shard %s's session; want 1", shard)
		}
	case <-time.After(wait):
		t.Fatal("the simulator saw no presence update")
	}
}

// dgBot is a discordgo session through the relay that records message
// contents and READY/RESUMED.
type dgBot struct {
	s       *discordgo.Session
	mu      sync.Mutex
	got     []string
	changed chan struct{}
	ready   int
	resumed int
	conns   []net.Conn
}

func newDgBot(t *testing.T, r *relayRig, shard int) *dgBot {
	t.Helper()
	discordgo.EndpointGateway = r.url + "/api/v10/gateway"
	s, err := discordgo.New("Bot " + token)
	if err != nil {
		t.Fatal(err)
	}
	b := &dgBot{s: s, changed: make(chan struct{}, 1)}
	s.ShardID, s.ShardCount = shard, 2
	s.Identify.Intents = relayIntents
	s.SyncEvents = true
	s.LogLevel = discordgo.LogWarning
	s.Dialer = &websocket.Dialer{HandshakeTimeout: wait, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
		return c, err
	}}
	note := func(f func()) {
		b.mu.Lock()
		f()
		b.mu.Unlock()
		select {
		case b.changed <- struct{}{}:
		default:
		}
	}
	s.AddHandler(func(_ *discordgo.Session, _ *discordgo.Ready) { note(func() { b.ready++ }) })
	s.AddHandler(func(_ *discordgo.Session, _ *discordgo.Resumed) { note(func() { b.resumed++ }) })
	s.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageCreate) {
		note(func() { b.got = append(b.got, m.Content) })
	})
	return b
}

// until waits for cond on the bot's record.
func (b *dgBot) until(t *testing.T, what string, cond func(b *dgBot) bool) {
	t.Helper()
	bound := time.After(wait)
	for {
		b.mu.Lock()
		ok := cond(b)
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-b.changed:
		case <-bound:
			b.mu.Lock()
			defer b.mu.Unlock()
			t.Fatalf("waiting for %s: ready %d, resumed %d, %d messages", what, b.ready, b.resumed, len(b.got))
		}
	}
}

// The bot's connection dies (as when its process is killed) and it comes
// back within the window: it resumes at the relay, and the messages
// published while it was away arrive once, in order; the shard's own
// session never noticed.
func TestDiscordgoResumesThroughRelay(t *testing.T) {
	rec := newRecorder()
	captureDiscordgoLog(t, rec)
	r := newRelayRig(t, rec)
	b := newDgBot(t, r, 0)
	if err := b.s.Open(); err != nil {
		t.Fatal(err)
	}
	defer b.s.Close()
	b.until(t, "READY", func(b *dgBot) bool { return b.ready == 1 })
	r.publish(t, 0, 100, "a")
	b.until(t, "100 messages", func(b *dgBot) bool { return len(b.got) == 100 })
	b.mu.Lock()
	b.conns[len(b.conns)-1].Close() // the bot's side of the TCP connection
	b.mu.Unlock()
	r.publish(t, 0, 100, "b")
	b.until(t, "RESUMED and 200 messages", func(b *dgBot) bool { return b.resumed == 1 && len(b.got) >= 200 })
	b.mu.Lock()
	got := append([]string(nil), b.got...)
	b.mu.Unlock()
	for i, c := range got {
		want := fmt.Sprintf("a%d", i)
		if i >= 100 {
			want = fmt.Sprintf("b%d", i-100)
		}
		if c != want {
			t.Fatalf("message %d is %q; want %q (once each, in order)", i, c, want)
		}
	}
	if len(got) != 200 {
		t.Errorf("%d messages; want 200", len(got))
	}
	if tot := r.sim.Totals(); tot.Identifies != 2 || tot.Resumes != 0 {
		t.Errorf("simulator: %d identifies, %d resumes; want the node's 2 and none (the bot's resume is the relay's)", tot.Identifies, tot.Resumes)
	}
	if cs := r.node.Relay.Clients(); len(cs) != 1 || cs[0].Resumes != 1 {
		t.Errorf("relay clients %+v; want one, resumed once", cs)
	}
}

// A music bot's shape: discordgo sends op 4 through the relay, and the
// bot's own VOICE_STATE_UPDATE and the guild's VOICE_SERVER_UPDATE reach
// that client, not another client of the same shard.
func TestVoiceThroughRelay(t *testing.T) {
	rec := newRecorder()
	captureDiscordgoLog(t, rec)
	ops := make(chan struct{}, 8)
	r := newRelayRigFrames(t, rec, func(f gatewaysim.Frame) {
		if f.Op == 4 {
			ops <- struct{}{}
		}
	})
	music, other := newDgBot(t, r, 0), newDgBot(t, r, 0)
	voice := map[*dgBot]chan string{music: make(chan string, 8), other: make(chan string, 8)}
	for b, ch := range voice {
		b.s.AddHandler(func(_ *discordgo.Session, e *discordgo.VoiceServerUpdate) { ch <- "server " + e.GuildID })
		b.s.AddHandler(func(_ *discordgo.Session, e *discordgo.VoiceStateUpdate) { ch <- "state " + e.UserID })
		if err := b.s.Open(); err != nil {
			t.Fatal(err)
		}
		defer b.s.Close()
		b.until(t, "READY", func(b *dgBot) bool { return b.ready == 1 })
	}
	g := strconv.FormatUint(r.sim.Guilds(0, 2)[0], 10)
	if err := music.s.ChannelVoiceJoinManual(g, "7", false, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ops:
	case <-time.After(wait):
		t.Fatal("the simulator saw no op 4")
	}
	me := music.s.State.User.ID
	for _, ev := range []gatewaysim.Event{
		{Name: "VOICE_STATE_UPDATE", Data: []byte(`{"guild_id":"` + g + `","channel_id":"7","user_id":"` + me + `","session_id":"v","deaf":false,"mute":false,"self_deaf":true,"self_mute":false,"self_video":false,"suppress":false,"request_to_speak_timestamp":null}`)},
		{Name: "VOICE_SERVER_UPDATE", Data: []byte(`{"guild_id":"` + g + `","token":"vt","endpoint":"voice.example:443"}`)},
	} {
		if _, err := r.sim.Publish(0, ev); err != nil {
			t.Fatal(err)
		}
	}
	r.publish(t, 0, 1, "after")
	for _, want := range []string{"state " + me, "server " + g} {
		select {
		case got := <-voice[music]:
			if got != want {
				t.Errorf("music client got %q; want %q", got, want)
			}
		case <-time.After(wait):
			t.Fatalf("music client: no %q", want)
		}
	}
	other.until(t, "the message after the voice events", func(b *dgBot) bool { return len(b.got) >= 1 })
	select {
	case got := <-voice[other]:
		t.Errorf("the other client got %q; want no voice event of the music client's join", got)
	default:
	}
}

// newRelayRigFrames is newRelayRig with onFrame set before the node starts.
func newRelayRigFrames(t *testing.T, rec *recorder, onFrame func(gatewaysim.Frame)) *relayRig {
	t.Helper()
	r := &relayRig{presence: make(chan string, 16), onFrame: onFrame}
	r.sim = newSim(t, rec, func(c *gatewaysim.Config) { c.OnFrame = onFrame })
	n, err := node.New(node.Config{Flavor: core.Discord, Token: token, GatewayURL: r.sim.GatewayURL(),
		Plan: core.Range(2, 0, 1), MaxConcurrency: 2, Intents: relayIntents, Relay: true, DispatchRetention: relayRetention})
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	n.Start()
	r.serve(t)
	return r
}
