package interop

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/node"
)

// fakeREST answers the REST the bots send through the relay and records
// it.
type fakeREST struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // "METHOD PATH AUTHORIZATION"
}

func newFakeREST(t *testing.T) *fakeREST {
	f := &fakeREST{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.got = append(f.got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/users/@me"):
			fmt.Fprint(w, `{"id":"1","username":"bot","discriminator":"0","global_name":null,"avatar":null,"bot":true,"flags":0}`)
		case strings.HasSuffix(r.URL.Path, "/applications/@me"):
			fmt.Fprint(w, `{"id":"1","name":"bot","icon":null,"description":"","rpc_origins":[],"bot_public":true,"bot_require_code_grant":false,"verify_key":"00","flags":0,"team":null,"owner":{"id":"2","username":"owner","discriminator":"0","global_name":null,"avatar":null}}`)
		case strings.HasSuffix(r.URL.Path, "/messages") && r.Method == http.MethodPost:
			ch := strings.Split(r.URL.Path, "/")[4]
			fmt.Fprintf(w, `{"id":"42","channel_id":%q,"content":"pong","type":0,"tts":false,"mention_everyone":false,"mentions":[],"mention_roles":[],"attachments":[],"embeds":[],"pinned":false,"timestamp":"2026-12-07T07:00:00.000000+00:00","edited_timestamp":null,"author":{"id":"1","username":"bot","discriminator":"0","avatar":null,"bot":true}}`, ch)
		default:
			fmt.Fprint(w, `{}`)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeREST) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

// botProcess is a bot library in a child process that prints one line per
// fact (READY N, MSG content, ...).
type botProcess struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
	seen  map[string]bool // every line expect read
}

// startBot runs argv in dir with env, and reads its standard output.
func startBot(t *testing.T, dir string, env []string, argv ...string) *botProcess {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &botProcess{cmd: cmd, lines: make(chan string, 4096), done: make(chan struct{}), seen: map[string]bool{}}
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			b.lines <- sc.Text()
		}
		close(b.lines)
	}()
	t.Cleanup(func() { b.stop() })
	return b
}

// stop ends the bot (SIGKILL, as when its process dies) and waits for it.
func (b *botProcess) stop() {
	if b.cmd.ProcessState == nil {
		b.cmd.Process.Kill()
		<-b.done
		b.cmd.Wait()
	}
}

// expect reads lines until one starts with prefix, failing on a line that
// fail reports; it returns the line.
func (b *botProcess) expect(t *testing.T, prefix string) string {
	t.Helper()
	// A child process is a boundary: bounded by a generous minute.
	bound := time.After(time.Minute)
	for {
		select {
		case l, ok := <-b.lines:
			if !ok {
				t.Fatalf("the bot exited before %q", prefix)
			}
			b.seen[l] = true
			if strings.HasPrefix(l, "ERROR") || strings.HasPrefix(l, "REPLY-FAILED") {
				t.Fatalf("the bot says: %s", l)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-bound:
			t.Fatalf("no %q from the bot within a minute", prefix)
		}
	}
}

// expectLine is expect for a whole line that may have come already.
func (b *botProcess) expectLine(t *testing.T, line string) {
	t.Helper()
	if !b.seen[line] {
		b.expect(t, line)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("bot: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newRelayRigREST is newRelayRig whose relay passes REST to rest; onFrame,
// when set, sees every frame at the simulator.
func newRelayRigREST(t *testing.T, rec *recorder, rest *fakeREST, onFrame func(gatewaysim.Frame)) *relayRig {
	t.Helper()
	r := &relayRig{presence: make(chan string, 16), onFrame: onFrame}
	r.sim = newSim(t, rec, func(c *gatewaysim.Config) {
		c.OnFrame = func(f gatewaysim.Frame) {
			if r.onFrame != nil {
				r.onFrame(f)
			}
			if f.Op == 3 {
				select {
				case r.presence <- fmt.Sprint(f.Shard):
				default:
				}
			}
		}
	})
	n, err := node.New(node.Config{Flavor: core.Discord, Token: token, GatewayURL: r.sim.GatewayURL(), API: rest.srv.URL + "/api/v10",
		Plan: core.Range(2, 0, 1), MaxConcurrency: 2, Intents: relayIntents, Relay: true, DispatchRetention: relayRetention})
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	n.Start()
	r.serve(t)
	return r
}

// needTool skips without the tool, unless in CI, where .ci/run installs it.
func needTool(t *testing.T, what, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (%v): .ci/run installs it", what, err)
		}
		t.Skipf("%s is missing (%v): see .ci/run", what, err)
	}
}

// discord.js v14, unchanged but for its REST base, logs in through the
// relay, reports ready with its shard's guilds, gets 1,000
// MESSAGE_CREATEs in order, replies to one through the relay's REST
// pass-through, and its presence update reaches the shard's session.
func TestDiscordJSThroughRelay(t *testing.T) {
	dir, _ := filepath.Abs("relay/js")
	needTool(t, "discord.js (npm ci in interop/relay/js)", filepath.Join(dir, "node_modules", "discord.js"))
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node", "/usr/bin/node")
	}
	rec := newRecorder()
	rest := newFakeREST(t)
	r := newRelayRigREST(t, rec, rest, nil)
	bot := startBot(t, dir, []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=1", "SHARD_COUNT=2"}, nodeBin, "bot.js")
	if got, want := bot.expect(t, "READY "), fmt.Sprintf("READY %d", len(r.sim.Guilds(1, 2))); got != want {
		t.Errorf("discord.js: %q; want %q", got, want)
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
	r.publish(t, 1, 1000, "m")
	for i := range 1000 {
		if got, want := bot.expect(t, "MSG "), fmt.Sprintf("MSG m%d", i); got != want {
			t.Fatalf("discord.js: %q; want %q (in order, none missing or doubled)", got, want)
		}
	}
	r.publishContent(t, 1, "ping")
	bot.expect(t, "MSG ping")
	bot.expect(t, "REPLIED")
	var posted bool
	for _, req := range rest.requests() {
		if strings.HasPrefix(req, "POST /api/v10/channels/") && strings.HasSuffix(req, " Bot "+token) {
			posted = true
		}
	}
	if !posted {
		t.Errorf("REST seen by the API: %q; want the reply's POST with the bot's Authorization", rest.requests())
	}
}

// Two discord.js processes on the same shard (a blue-green deploy): both
// get every message, in order, and the shard's session is the node's one.
func TestTwoDiscordJSOnOneShard(t *testing.T) {
	dir, _ := filepath.Abs("relay/js")
	needTool(t, "discord.js (npm ci in interop/relay/js)", filepath.Join(dir, "node_modules", "discord.js"))
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		needTool(t, "node", "/usr/bin/node")
	}
	rec := newRecorder()
	r := newRelayRigREST(t, rec, newFakeREST(t), nil)
	env := []string{"RELAY_URL=" + r.url, "BOT_TOKEN=" + token, "SHARD=0", "SHARD_COUNT=2"}
	blue := startBot(t, dir, env, nodeBin, "bot.js")
	green := startBot(t, dir, env, nodeBin, "bot.js")
	blue.expect(t, "READY ")
	green.expect(t, "READY ")
	r.publish(t, 0, 500, "m")
	for _, b := range []*botProcess{blue, green} {
		for i := range 500 {
			if got, want := b.expect(t, "MSG "), fmt.Sprintf("MSG m%d", i); got != want {
				t.Fatalf("discord.js: %q; want %q", got, want)
			}
		}
	}
	if tot := r.sim.Totals(); tot.Identifies != 2 || tot.MaxLiveSessions != 1 {
		t.Errorf("simulator: %d identifies, at most %d live sessions a shard; want the node's 2 and 1", tot.Identifies, tot.MaxLiveSessions)
	}
	if cs := r.node.Relay.Clients(); len(cs) != 2 || cs[0].Shard != 0 || cs[1].Shard != 0 {
		t.Errorf("relay clients %+v; want two on shard 0", cs)
	}
}
