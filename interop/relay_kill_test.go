package interop

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// A discord.js bot process is killed (SIGKILL) and started again within
// the resume window: the new process resumes the session the first one
// kept in a file (@discordjs/ws's session info, see keep-session.js),
// gets the messages published while it was down once each, in order, and
// then the live ones; no READY, and the simulator sees only the node's
// identifies.
func TestDiscordJSResumesAfterKill(t *testing.T) {
	dir, _ := filepath.Abs("relay/js")
	needTool(t, "discord.js (npm ci in interop/relay/js)", filepath.Join(dir, "node_modules", "discord.js"))
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node", "/usr/bin/node")
	}
	rec := newRecorder()
	r := newRelayRigREST(t, rec, newFakeREST(t), nil)
	env := []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=1", "SHARD_COUNT=2",
		"SESSION_FILE=" + filepath.Join(t.TempDir(), "session.json")}
	first := startBot(t, dir, env, nodeBin, "keep-session.js")
	first.expect(t, "READY ")
	r.publish(t, 1, 50, "a")
	for i := range 50 {
		if got, want := first.expect(t, "RAW "), fmt.Sprintf("RAW a%d", i); got != want {
			t.Fatalf("before the kill: %q; want %q", got, want)
		}
	}
	first.stop() // SIGKILL: no close frame, nothing saved on the way out
	r.publish(t, 1, 50, "b")

	second := startBot(t, dir, env, nodeBin, "keep-session.js")
	for i := range 50 {
		if got, want := second.expect(t, "RAW "), fmt.Sprintf("RAW b%d", i); got != want {
			t.Fatalf("after the restart: %q; want %q (what was published while the bot was down, once, in order)", got, want)
		}
	}
	// discord.js may print its shardResume before the last replayed
	// event's raw line: its handlers finish out of order.
	second.expectLine(t, "RESUMED 50")
	r.publish(t, 1, 10, "c")
	for i := range 10 {
		if got, want := second.expect(t, "RAW "), fmt.Sprintf("RAW c%d", i); got != want {
			t.Fatalf("live after the resume: %q; want %q", got, want)
		}
	}
	for l := range second.seen {
		if strings.HasPrefix(l, "READY") {
			t.Errorf("the second process says %q; want a resume, not a new session", l)
		}
	}
	if tot := r.sim.Totals(); tot.Identifies != 2 {
		t.Errorf("simulator: %d identifies; want the node's 2", tot.Identifies)
	}
	if cs := r.node.Relay.Clients(); len(cs) != 1 || cs[0].Resumes != 1 {
		t.Errorf("relay clients %+v; want the one session, resumed once", cs)
	}
}

// A music bot's shape with discord.js: the process that joins a voice
// channel through the guild's voice adapter (op 4 through the relay) gets
// the bot's own VOICE_STATE_UPDATE and the guild's VOICE_SERVER_UPDATE in
// its adapter; a second discord.js process on the same shard gets neither.
func TestDiscordJSVoiceThroughRelay(t *testing.T) {
	dir, _ := filepath.Abs("relay/js")
	needTool(t, "discord.js (npm ci in interop/relay/js)", filepath.Join(dir, "node_modules", "discord.js"))
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node", "/usr/bin/node")
	}
	rec := newRecorder()
	ops := make(chan string, 8)
	r := newRelayRigREST(t, rec, newFakeREST(t), func(f gatewaysim.Frame) {
		if f.Op == 4 {
			ops <- fmt.Sprint(f.Shard)
		}
	})
	env := []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=0", "SHARD_COUNT=2"}
	other := startBot(t, dir, env, nodeBin, "voice.js")
	other.expect(t, "READY ")
	music := startBot(t, dir, append(env, "JOIN=1"), nodeBin, "voice.js")
	ready := strings.Fields(music.expect(t, "READY "))
	g := fmt.Sprint(r.sim.Guilds(0, 2)[0])
	if got := music.expect(t, "JOIN "); got != "JOIN "+g+" true" {
		t.Fatalf("discord.js: %q; want the op 4 sent for guild %s", got, g)
	}
	select {
	case shard := <-ops:
		if shard != "0" {
			t.Errorf("op 4 on shard %s's session; want 0", shard)
		}
	case <-time.After(time.Minute):
		t.Fatal("the simulator saw no op 4")
	}
	me := ready[2]
	for _, ev := range []gatewaysim.Event{
		{Name: "VOICE_STATE_UPDATE", Data: []byte(`{"guild_id":"` + g + `","channel_id":"7","user_id":"` + me + `","session_id":"v","deaf":false,"mute":false,"self_deaf":true,"self_mute":false,"self_video":false,"suppress":false,"request_to_speak_timestamp":null,` +
			// As Discord sends it in a guild; discord.js calls the adapter
			// only for a state whose member it knows to be the bot.
			`"member":{"user":{"id":"` + me + `","username":"bot","discriminator":"0","avatar":null,"bot":true},"roles":[],"joined_at":"2026-12-07T07:00:00.000000+00:00","deaf":false,"mute":false}}`)},
		{Name: "VOICE_SERVER_UPDATE", Data: []byte(`{"guild_id":"` + g + `","token":"vt","endpoint":"voice.example:443"}`)},
	} {
		if _, err := r.sim.Publish(0, ev); err != nil {
			t.Fatal(err)
		}
	}
	r.publish(t, 0, 1, "after")
	music.expect(t, "ADAPTER STATE "+me+" 7")
	music.expect(t, "ADAPTER SERVER "+g+" voice.example:443")
	other.expect(t, "MSG after0")
	for l := range other.seen {
		if strings.HasPrefix(l, "VOICE ") || strings.HasPrefix(l, "ADAPTER ") {
			t.Errorf("the other process says %q; want no voice event of the music process's join", l)
		}
	}
}
