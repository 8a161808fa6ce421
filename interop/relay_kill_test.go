package interop

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
