package interop

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// debianPython is Debian's interpreter, the one python3-discord installs
// for (a python3 earlier in PATH may be another).
const debianPython = "/usr/bin/python3"

// discord.py 2.x (Debian's python3-discord), unchanged but for its URLs,
// logs in through the relay (its /users/@me goes through the REST
// pass-through), reports ready with its shard's guilds, gets 1,000
// MESSAGE_CREATEs in order, and its presence update reaches the shard's
// session. Its op 8 reaches the shard's session, and the chunk goes to it
// alone: a discordgo client on the same shard gets the messages, not the
// chunk.
func TestDiscordPyThroughRelay(t *testing.T) {
	needTool(t, "python3", debianPython)
	if exec.Command(debianPython, "-c", "import discord").Run() != nil {
		needTool(t, "python3-discord", "/usr/lib/python3/dist-packages/discord")
	}
	dir, _ := filepath.Abs("relay/py")
	rec := newRecorder()
	rest := newFakeREST(t)
	ops := make(chan int, 64)
	r := newRelayRigREST(t, rec, rest, func(f gatewaysim.Frame) {
		if f.Op == 8 {
			ops <- f.Op
		}
	})
	bot := startBot(t, dir, []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=1", "SHARD_COUNT=2"}, debianPython, "bot.py")
	if got, want := bot.expect(t, "READY "), fmt.Sprintf("READY %d", len(r.sim.Guilds(1, 2))); got != want {
		t.Errorf("discord.py: %q; want %q", got, want)
	}
	bot.expect(t, "PRESENCE")
	select {
	case shard := <-r.presence:
		if shard != "1" {
			t.Errorf("presence update on shard %s's session; want 1", shard)
		}
	case <-time.After(time.Minute):
		t.Fatal("the simulator saw no presence update")
	}

	other := newDgBot(t, r, 1)
	chunks := make(chan struct{}, 8)
	other.s.AddHandler(func(_ *discordgo.Session, _ *discordgo.GuildMembersChunk) { chunks <- struct{}{} })
	if err := other.s.Open(); err != nil {
		t.Fatal(err)
	}
	defer other.s.Close()
	other.until(t, "READY", func(b *dgBot) bool { return b.ready == 1 })

	r.publish(t, 1, 1000, "m")
	for i := range 1000 {
		if got, want := bot.expect(t, "MSG "), fmt.Sprintf("MSG m%d", i); got != want {
			t.Fatalf("discord.py: %q; want %q (in order, none missing or doubled)", got, want)
		}
	}
	r.publishContent(t, 1, "chunk")
	bot.expect(t, "MSG chunk")
	select {
	case <-ops:
	case <-time.After(time.Minute):
		t.Fatal("the simulator saw no op 8")
	}
	// The relay's nonces are "relay" and a base-36 counter from 1
	// (relay/doc.go): this is the node's first op 8.
	g := r.sim.Guilds(1, 2)[0]
	chunk := fmt.Sprintf(`{"guild_id":"%d","members":[{"user":{"id":"5","username":"u","discriminator":"0","avatar":null},"roles":[],"joined_at":"2026-12-07T07:00:00.000000+00:00","deaf":false,"mute":false,"flags":0}],"chunk_index":0,"chunk_count":1,"nonce":"relay1"}`, g)
	if _, err := r.sim.Publish(1, gatewaysim.Event{Name: "GUILD_MEMBERS_CHUNK", Data: []byte(chunk)}); err != nil {
		t.Fatal(err)
	}
	if got := bot.expect(t, "CHUNKED "); got == "CHUNKED 0" {
		t.Errorf("discord.py: %q; want the chunk's member", got)
	}
	r.publishContent(t, 1, "after")
	other.until(t, "1,002 messages", func(b *dgBot) bool { return len(b.got) >= 1002 })
	select {
	case <-chunks:
		t.Error("the other client on the shard got the chunk discord.py asked for")
	default:
	}
}
