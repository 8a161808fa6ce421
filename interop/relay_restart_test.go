package interop

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/node"
)

// memSessions keeps the shards' snapshots between two nodes, as a
// sessions folder does between two processes.
type memSessions struct {
	mu    sync.Mutex
	snaps map[int]core.Snapshot
}

func (m *memSessions) Load(_ context.Context, shard int) (core.Snapshot, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.snaps[shard]
	return s, ok, nil
}

func (m *memSessions) Save(_ context.Context, shard int, s core.Snapshot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snaps[shard] = s
	return nil
}

// shardfs restarts cleanly under a connected discord.js bot: the bot
// resumes against the new process, with no message lost or doubled, and
// the simulator sees no identify, only the node's resumes.
func TestDiscordJSResumesAcrossRestart(t *testing.T) {
	dir, _ := filepath.Abs("relay/js")
	needTool(t, "discord.js (npm ci in interop/relay/js)", filepath.Join(dir, "node_modules", "discord.js"))
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node", "/usr/bin/node")
	}
	rec := newRecorder()
	rest := newFakeREST(t)
	r := &relayRig{presence: make(chan string, 16)}
	r.sim = newSim(t, rec, nil)
	store := &memSessions{snaps: map[int]core.Snapshot{}}
	cfg := node.Config{Flavor: core.Discord, Token: token, GatewayURL: r.sim.GatewayURL(), API: rest.srv.URL + "/api/v10",
		Plan: core.Range(2, 0, 1), MaxConcurrency: 2, Intents: relayIntents, Relay: true, DispatchRetention: relayRetention,
		Sessions: store, RelayState: filepath.Join(t.TempDir(), "relay.json")}
	addr := ""
	run := func() (stop func()) {
		n, err := node.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.node = n
		n.Start()
		l, err := net.Listen("tcp", cmpOr(addr, "127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		addr = l.Addr().String()
		r.url = "http://" + addr
		var wg sync.WaitGroup
		wg.Go(func() { n.Relay.Serve(l) })
		var once sync.Once
		stop = func() {
			once.Do(func() {
				n.Close()
				wg.Wait()
			})
		}
		t.Cleanup(stop)
		return stop
	}
	stop := run()
	bot := startBot(t, dir, []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=0", "SHARD_COUNT=2"}, nodeBin, "bot.js")
	bot.expect(t, "READY ")
	r.publish(t, 0, 100, "a")
	for i := range 100 {
		if got, want := bot.expect(t, "MSG "), fmt.Sprintf("MSG a%d", i); got != want {
			t.Fatalf("before the restart: %q; want %q", got, want)
		}
	}
	stop()
	run()
	r.publish(t, 0, 100, "b")
	// RESUMED comes after the replay of what was published before the
	// bot reconnected, before what came later.
	for i := range 100 {
		if got, want := bot.expect(t, "MSG "), fmt.Sprintf("MSG b%d", i); got != want {
			t.Fatalf("after the restart: %q; want %q (none lost or doubled)", got, want)
		}
	}
	bot.expectLine(t, "RESUMED")
	if tot := r.sim.Totals(); tot.Identifies != 2 || tot.Resumes != 2 {
		t.Errorf("simulator: %d identifies, %d resumes; want the first node's 2 and the second's 2 resumes", tot.Identifies, tot.Resumes)
	}
	if cs := r.node.Relay.Clients(); len(cs) != 1 || cs[0].Resumes != 1 {
		t.Errorf("relay clients %+v; want the one bot, resumed once", cs)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
