package gatewaysim

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/shardfs/shardfs/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var flavors = []Flavor{Discord, Fluxer}

func TestDiscovery(t *testing.T) {
	type limit struct {
		Total          int   `json:"total"`
		Remaining      int   `json:"remaining"`
		ResetAfter     int64 `json:"reset_after"`
		MaxConcurrency int   `json:"max_concurrency"`
	}
	type body struct {
		URL               string `json:"url"`
		Shards            int    `json:"shards"`
		SessionStartLimit limit  `json:"session_start_limit"`
	}
	tests := []struct {
		name       string
		flavor     Flavor
		auth       string
		wantStatus int
		want       body
	}{
		{"discord with token", Discord, "Bot sim-token", 200, body{Shards: 4, SessionStartLimit: limit{Total: 1000, Remaining: 997, MaxConcurrency: 2}}},
		{"discord without token", Discord, "", 401, body{}},
		{"discord token without Bot prefix", Discord, "sim-token", 401, body{}},
		{"discord wrong token", Discord, "Bot other", 401, body{}},
		{"fluxer with token", Fluxer, "Bot sim-token", 200, body{Shards: 1, SessionStartLimit: limit{Total: 1000, Remaining: 999, ResetAfter: 14400000, MaxConcurrency: 1}}},
		{"fluxer without token", Fluxer, "", 401, body{}},
		{"fluxer bearer token", Fluxer, "Bearer sim-token", 401, body{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: tt.flavor, Shards: 4, MaxConcurrency: 2, SessionStartUsed: 3})
			var got body
			status := getJSON(t, srv.APIURL()+"/gateway/bot", tt.auth, &got)
			if status != tt.wantStatus {
				t.Fatalf("GET /gateway/bot with %q = %d; want %d", tt.auth, status, tt.wantStatus)
			}
			if status != 200 {
				return
			}
			if got.URL != srv.GatewayURL() {
				t.Errorf("url = %q; want %q", got.URL, srv.GatewayURL())
			}
			if tt.flavor == Discord {
				if got.SessionStartLimit.ResetAfter != (24 * time.Hour).Milliseconds() {
					t.Errorf("reset_after = %d; want a day", got.SessionStartLimit.ResetAfter)
				}
				got.SessionStartLimit.ResetAfter = 0
			}
			got.URL = ""
			if got != tt.want {
				t.Errorf("GET /gateway/bot = %+v; want %+v", got, tt.want)
			}
		})
	}
	t.Run("discord gateway without auth", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{})
		var got map[string]string
		if status := getJSON(t, srv.APIURL()+"/gateway", "", &got); status != 200 || got["url"] != srv.GatewayURL() {
			t.Fatalf("GET /gateway = %d %v; want 200 %s", status, got, srv.GatewayURL())
		}
	})
}

// TestAvailableVersions connects with each gateway version Discord's API
// reference lists as "Available" (10 and 9; discordgo v0.29.0 asks for 9)
// and with Fluxer's only one, and checks that READY reports it.
func TestAvailableVersions(t *testing.T) {
	for _, tt := range []struct {
		flavor  Flavor
		version int
	}{{Discord, 10}, {Discord, 9}, {Fluxer, 1}} {
		t.Run(fmt.Sprintf("%s v%d", tt.flavor, tt.version), func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: tt.flavor})
			c := dialQuery(t, srv.GatewayURL(), fmt.Sprintf("v=%d&encoding=json", tt.version))
			c.expect(opHello, "")
			c.identify(identifyOpts{intents: IntentGuilds})
			var r struct {
				V int `json:"v"`
			}
			if err := json.Unmarshal(c.expect(opDispatch, "READY").D, &r); err != nil {
				t.Fatal(err)
			}
			if r.V != tt.version {
				t.Errorf("READY v = %d; want %d", r.V, tt.version)
			}
		})
	}
}

func TestHandshake(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: flavor, Shards: 3, Guilds: 8})
			c := dial(t, srv, "")
			hello := c.expect(opHello, "")
			var h struct {
				HeartbeatInterval int `json:"heartbeat_interval"`
			}
			if err := json.Unmarshal(hello.D, &h); err != nil || h.HeartbeatInterval != 41250 {
				t.Fatalf("Hello d = %s; want heartbeat_interval 41250", hello.D)
			}
			c.identify(identifyOpts{token: "Bot sim-token", shard: []int{1, 3}, intents: IntentGuilds})
			f := c.expect(opDispatch, "READY")
			if f.seq() != 1 {
				t.Errorf("READY s = %d; want 1", f.seq())
			}
			var r readyData
			if err := json.Unmarshal(f.D, &r); err != nil {
				t.Fatal(err)
			}
			wantResume := srv.ResumeURL()
			if flavor == Fluxer {
				wantResume = ""
			}
			if r.SessionID == "" || r.ResumeGatewayURL != wantResume || fmt.Sprint(r.Shard) != "[1 3]" {
				t.Errorf("READY = %+v; want a session id, resume url %q, shard [1 3]", r, wantResume)
			}
			guilds := srv.Guilds(1, 3)
			if len(guilds) != 3 || len(r.Guilds) != len(guilds) {
				t.Fatalf("READY has %d guilds, Guilds(1, 3) = %v; want 3 of 8", len(r.Guilds), guilds)
			}
			for i, g := range guilds {
				if r.Guilds[i].ID != strconv.FormatUint(g, 10) || !r.Guilds[i].Unavailable {
					t.Errorf("READY guild %d = %+v; want %d unavailable", i, r.Guilds[i], g)
				}
				gc := c.expect(opDispatch, "GUILD_CREATE")
				var d struct {
					ID string `json:"id"`
				}
				_ = json.Unmarshal(gc.D, &d)
				id, _ := strconv.ParseUint(d.ID, 10, 64)
				if id != g || ShardOf(id, 3) != 1 || gc.seq() != int64(i+2) {
					t.Errorf("GUILD_CREATE %s s=%d; want guild %d of shard 1 at s=%d", d.ID, gc.seq(), g, i+2)
				}
			}
			c.heartbeat(4)
			c.expect(opHeartbeatACK, "")
			waitFor(t, srv, "a heartbeat counted", func() bool {
				return srv.Stats(1).Heartbeats == 1 && srv.Stats(1).Dispatched == 4
			})
			st := srv.Stats(1)
			if st.Identifies != 1 || st.LiveSessions != 1 || st.MaxLiveSessions != 1 || st.Dispatched != 4 {
				t.Errorf("Stats(1) = %+v; want 1 identify, 1 live, 4 dispatched", st)
			}
			if s := srv.Sessions(1); len(s) != 1 || s[0].Seq != 4 || s[0].Sent != 4 || s[0].Acked != 4 || !s[0].Live {
				t.Errorf("Sessions(1) = %+v; want one live session at 4 sent and acked", s)
			}
		})
	}
}

// TestEnforcement drives every rule that closes a connection.
func TestEnforcement(t *testing.T) {
	big := `{"op":1,"d":null,"pad":"` + strings.Repeat("x", MaxPayload) + `"}`
	tests := []struct {
		name   string
		flavor Flavor
		cfg    Config
		query  string // replaces the flavor's query when set
		steps  func(t *testing.T, c *testClient, srv *Server)
		code   int
	}{
		{name: "bad token", steps: identifyWith(identifyOpts{token: "nope", intents: 0}), code: CloseAuthenticationFailed},
		{name: "fluxer bad token", flavor: Fluxer, steps: identifyWith(identifyOpts{token: "nope"}), code: CloseAuthenticationFailed},
		{name: "shard id out of range", steps: identifyWith(identifyOpts{shard: []int{2, 2}, intents: 0}), code: CloseInvalidShard},
		{name: "shard total zero", steps: identifyWith(identifyOpts{shard: []int{0, 0}, intents: 0}), code: CloseInvalidShard},
		{name: "shard not a pair", steps: identifyWith(identifyOpts{shard: []int{0}, intents: 0}), code: CloseInvalidShard},
		{name: "fluxer shard out of range", flavor: Fluxer, steps: identifyWith(identifyOpts{shard: []int{1, 1}}), code: CloseInvalidShard},
		{name: "sharding required with another total", cfg: Config{Shards: 4, ShardingRequired: true}, steps: identifyWith(identifyOpts{shard: []int{0, 2}, intents: 0}), code: CloseInvalidShard},
		{name: "too many guilds", cfg: Config{Guilds: MaxGuildsPerShard + 1}, steps: identifyWith(identifyOpts{shard: []int{0, 1}, intents: 0}), code: CloseShardingRequired},
		{name: "fluxer too many communities", flavor: Fluxer, cfg: Config{Guilds: MaxGuildsPerShard + 1}, steps: identifyWith(identifyOpts{}), code: CloseShardingRequired},
		{name: "discord version", query: "v=11&encoding=json", code: CloseInvalidAPIVersion},
		{name: "discord deprecated version", query: "v=8&encoding=json", code: CloseInvalidAPIVersion},
		{name: "discord no version", query: "encoding=json", code: CloseInvalidAPIVersion},
		{name: "fluxer version", flavor: Fluxer, query: "v=10&encoding=json", code: CloseInvalidAPIVersion},
		{name: "invalid intents", steps: identifyWith(identifyOpts{intents: uint64(1) << 18}), code: CloseInvalidIntents},
		{name: "missing intents", steps: identifyWith(identifyOpts{}), code: CloseInvalidIntents},
		{name: "negative intents", steps: identifyWith(identifyOpts{intents: -1}), code: CloseInvalidIntents},
		{name: "disallowed intents", cfg: Config{DeniedIntents: IntentGuildMembers}, steps: identifyWith(identifyOpts{intents: IntentGuildMembers | IntentGuilds}), code: CloseDisallowedIntents},
		{name: "already authenticated", steps: func(t *testing.T, c *testClient, srv *Server) {
			c.start(srv, 0, 1)
			c.identify(identifyOpts{intents: 0})
		}, code: CloseAlreadyAuthenticated},
		{name: "resume after identify", steps: func(t *testing.T, c *testClient, srv *Server) {
			r, seq := c.start(srv, 0, 1)
			c.resume(r.SessionID, seq)
		}, code: CloseAlreadyAuthenticated},
		{name: "presence before identify", steps: sendRaw(`{"op":3,"d":{"status":"online"}}`), code: CloseNotAuthenticated},
		{name: "fluxer lazy request before identify", flavor: Fluxer, steps: sendRaw(`{"op":14,"d":{}}`), code: CloseNotAuthenticated},
		{name: "unknown opcode", steps: sendRaw(`{"op":42,"d":null}`), code: CloseUnknownOpcode},
		{name: "server opcode from client", steps: sendRaw(`{"op":10,"d":null}`), code: CloseUnknownOpcode},
		{name: "fluxer opcode on discord", steps: sendRaw(`{"op":14,"d":null}`), code: CloseUnknownOpcode},
		{name: "invalid JSON", steps: sendRaw(`{"op":`), code: CloseDecodeError},
		{name: "missing op", steps: sendRaw(`{"d":null}`), code: CloseDecodeError},
		{name: "op not an integer", steps: sendRaw(`{"op":1.5,"d":null}`), code: CloseDecodeError},
		{name: "payload not an object", steps: sendRaw(`[1,2]`), code: CloseDecodeError},
		{name: "two payloads in one message", steps: sendRaw(`{"op":1,"d":null}{"op":1,"d":null}`), code: CloseDecodeError},
		{name: "identify data not an object", steps: sendRaw(`{"op":2,"d":"sim-token"}`), code: CloseDecodeError},
		{name: "heartbeat data not a sequence", steps: sendRaw(`{"op":1,"d":"x"}`), code: CloseDecodeError},
		{name: "payload over 4096 bytes", steps: sendRaw(big), code: CloseDecodeError},
		{name: "fluxer payload over 4096 bytes", flavor: Fluxer, steps: sendRaw(big), code: CloseDecodeError},
		{name: "fluxer heartbeat beyond the last sequence", flavor: Fluxer, steps: func(t *testing.T, c *testClient, srv *Server) {
			_, seq := c.start(srv, 0, 1)
			c.heartbeat(seq + 1)
		}, code: CloseInvalidSeq},
		{name: "resume beyond the last sequence", steps: func(t *testing.T, c *testClient, srv *Server) {
			r, seq := c.start(srv, 0, 1)
			c.closeWith(4000)
			waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 })
			*c = *dialQuery(t, r.ResumeGatewayURL, "v=10&encoding=json")
			c.expect(opHello, "")
			c.resume(r.SessionID, seq+5)
		}, code: CloseInvalidSeq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Flavor = tt.flavor
			srv, _ := newTestServer(t, cfg)
			var c *testClient
			if tt.query != "" {
				c = dialQuery(t, srv.GatewayURL(), tt.query)
			} else {
				c = dial(t, srv, "")
			}
			if tt.steps != nil {
				tt.steps(t, c, srv)
			}
			c.expectClose(tt.code)
		})
	}
}

func identifyWith(o identifyOpts) func(*testing.T, *testClient, *Server) {
	return func(t *testing.T, c *testClient, srv *Server) {
		c.expect(opHello, "")
		c.identify(o)
	}
}

func sendRaw(payload string) func(*testing.T, *testClient, *Server) {
	return func(t *testing.T, c *testClient, srv *Server) {
		c.expect(opHello, "")
		c.sendRaw([]byte(payload))
	}
}

func TestFluxerIgnoresIntents(t *testing.T) {
	srv, _ := newTestServer(t, Config{Flavor: Fluxer})
	c := dial(t, srv, "")
	c.expect(opHello, "")
	c.identify(identifyOpts{intents: uint64(1) << 40})
	c.expect(opDispatch, "READY")
}

func TestHeartbeatTimeout(t *testing.T) {
	t.Run("discord", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{})
		timeout := srv.Config().HeartbeatTimeout
		if timeout != 41250*time.Millisecond*3/2 {
			t.Fatalf("default HeartbeatTimeout = %v; want 1.5 intervals", timeout)
		}
		c := dial(t, srv, "")
		c.expect(opHello, "")
		fc.Advance(timeout - time.Millisecond)
		c.heartbeat(-1)
		c.expect(opHeartbeatACK, "")
		fc.Advance(timeout - time.Millisecond)
		c.heartbeat(-1)
		c.expect(opHeartbeatACK, "")
		fc.Advance(timeout)
		c.expectClose(CloseSessionTimedOut)
	})
	t.Run("fluxer asks, then closes after 45 s", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{Flavor: Fluxer})
		cfg := srv.Config()
		if cfg.HeartbeatTimeout != 45*time.Second || cfg.HeartbeatRequestAfter != 37125*time.Millisecond {
			t.Fatalf("Fluxer defaults: timeout %v, request after %v; want 45s and 37.125s", cfg.HeartbeatTimeout, cfg.HeartbeatRequestAfter)
		}
		answered := dial(t, srv, "")
		silent := dial(t, srv, "")
		answered.expect(opHello, "")
		silent.expect(opHello, "")
		fc.Advance(cfg.HeartbeatRequestAfter)
		answered.expect(opHeartbeat, "")
		silent.expect(opHeartbeat, "")
		answered.heartbeat(-1)
		answered.expect(opHeartbeatACK, "")
		fc.Advance(cfg.HeartbeatTimeout - cfg.HeartbeatRequestAfter)
		silent.expectClose(CloseSessionTimedOut)
		// The answered connection is asked again 37.125 s after its answer.
		fc.Advance(2*cfg.HeartbeatRequestAfter - cfg.HeartbeatTimeout - time.Millisecond)
		answered.heartbeat(-1)
		answered.expect(opHeartbeatACK, "")
		fc.Advance(cfg.HeartbeatRequestAfter)
		answered.expect(opHeartbeat, "")
	})
}

func TestSendBudget(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor.String(), func(t *testing.T) {
			srv, fc := newTestServer(t, Config{Flavor: flavor, HeartbeatInterval: time.Hour})
			limit := srv.Config().SendLimit
			want := map[Flavor]int{Discord: 120, Fluxer: 500}[flavor]
			if limit != want {
				t.Fatalf("SendLimit = %d; want %d", limit, want)
			}
			c := dial(t, srv, "")
			c.expect(opHello, "")
			for range limit {
				c.heartbeat(-1)
				c.expect(opHeartbeatACK, "")
			}
			fc.Advance(srv.Config().SendWindow)
			for range limit {
				c.heartbeat(-1)
				c.expect(opHeartbeatACK, "")
			}
			c.heartbeat(-1)
			c.expectClose(CloseRateLimited)
		})
	}
}

func TestResume(t *testing.T) {
	for _, flavor := range flavors {
		t.Run(flavor.String()+" within the window", func(t *testing.T) {
			srv, fc := newTestServer(t, Config{Flavor: flavor, Shards: 2, HeartbeatInterval: time.Hour})
			c := dial(t, srv, "")
			r, _ := c.start(srv, 1, 2)
			publish(t, srv, 1, 3)
			first := c.expect(opDispatch, "MESSAGE_CREATE")
			c.closeWith(4000)
			waitFor(t, srv, "detach", func() bool { return srv.Stats(1).LiveSessions == 0 })
			publish(t, srv, 1, 2)
			fc.Advance(srv.Config().ResumeWindow - time.Second)

			url := r.ResumeGatewayURL
			if flavor == Fluxer {
				url = srv.GatewayURL()
			}
			c2 := dialQuery(t, url, map[Flavor]string{Discord: "v=10&encoding=json", Fluxer: "v=1"}[flavor])
			c2.expect(opHello, "")
			c2.resume(r.SessionID, first.seq())
			for i := int64(1); i <= 4; i++ {
				if f := c2.expect(opDispatch, "MESSAGE_CREATE"); f.seq() != first.seq()+i {
					t.Fatalf("replayed s = %d; want %d", f.seq(), first.seq()+i)
				}
			}
			c2.expect(opDispatch, "RESUMED")
			publish(t, srv, 1, 1)
			if f := c2.expect(opDispatch, "MESSAGE_CREATE"); f.seq() != first.seq()+5 {
				t.Fatalf("s after RESUMED = %d; want %d", f.seq(), first.seq()+5)
			}
			st := srv.Stats(1)
			if st.Resumes != 1 || st.ReplayedEvents != 4 || st.SequenceGaps != 0 || st.LiveSessions != 1 || st.MaxLiveSessions != 1 || st.Identifies != 1 {
				t.Errorf("Stats(1) = %+v; want 1 identify, 1 resume of 4 events, no gap, 1 live", st)
			}
		})
		t.Run(flavor.String()+" after the window", func(t *testing.T) {
			srv, fc := newTestServer(t, Config{Flavor: flavor, HeartbeatInterval: time.Hour})
			c := dial(t, srv, "")
			r, seq := c.start(srv, 0, 1)
			c.closeWith(4000)
			waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 })
			fc.Advance(srv.Config().ResumeWindow)
			waitFor(t, srv, "expiry", func() bool { return len(srv.Sessions(0)) == 0 })
			c2 := dial(t, srv, "")
			c2.expect(opHello, "")
			c2.resume(r.SessionID, seq)
			if f := c2.expect(opInvalidSession, ""); string(f.D) != "false" {
				t.Fatalf("op 9 d = %s; want false", f.D)
			}
			// The socket stays open: the client may identify on it.
			c2.identify(identifyOpts{intents: IntentGuilds})
			c2.expect(opDispatch, "READY")
			if got := srv.Totals().FailedResumes; got != 1 {
				t.Errorf("FailedResumes = %d; want 1", got)
			}
		})
		t.Run(flavor.String()+" after close 1000", func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: flavor})
			c := dial(t, srv, "")
			r, seq := c.start(srv, 0, 1)
			c.closeWith(1000)
			waitFor(t, srv, "session end", func() bool { return len(srv.Sessions(0)) == 0 })
			c2 := dial(t, srv, "")
			c2.expect(opHello, "")
			c2.resume(r.SessionID, seq)
			c2.expect(opInvalidSession, "")
		})
	}
	t.Run("takeover of an attached session", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{})
		a := dial(t, srv, "")
		r, seq := a.start(srv, 0, 1)
		b := dialQuery(t, r.ResumeGatewayURL, "v=10&encoding=json")
		b.expect(opHello, "")
		b.resume(r.SessionID, seq)
		b.expect(opDispatch, "RESUMED")
		a.expectClose(CloseUnknownError)
		waitFor(t, srv, "old connection gone", func() bool { return srv.Connections() == 1 })
		if got := srv.Accepted(); got != 2 {
			t.Errorf("Accepted() = %d; want 2", got)
		}
		if st := srv.Stats(0); st.LiveSessions != 1 || st.Resumes != 1 {
			t.Errorf("Stats(0) = %+v; want 1 live, 1 resume", st)
		}
	})
}

func publish(t *testing.T, srv *Server, shardID, n int) {
	t.Helper()
	for i := range n {
		if _, err := srv.Publish(shardID, Event{Name: "MESSAGE_CREATE", Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReplayGaps(t *testing.T) {
	// resumeAfter identifies, publishes events it does not read, drops the
	// connection and resumes from the last GUILD_CREATE; it returns the
	// sequences replayed, or nil for op 9.
	resumeAfter := func(t *testing.T, srv *Server, pub func(), from func(seq int64) int64) []int64 {
		c := dial(t, srv, "")
		r, seq := c.start(srv, 0, 1)
		pub()
		c.closeWith(4000)
		waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 })
		c2 := dial(t, srv, "")
		c2.expect(opHello, "")
		c2.resume(r.SessionID, from(seq))
		var got []int64
		for {
			f, err := c2.next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Op == opInvalidSession {
				return nil
			}
			if f.T == "RESUMED" {
				return got
			}
			got = append(got, f.seq())
		}
	}
	same := func(seq int64) int64 { return seq }
	t.Run("fluxer every second event unretained", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer, UnretainedEvery: 2})
		got := resumeAfter(t, srv, func() { publish(t, srv, 0, 4) }, same)
		// Events at 3..6; 4 and 6 were never retained.
		if fmt.Sprint(got) != "[3 5]" {
			t.Fatalf("replayed %v; want [3 5]", got)
		}
		if st := srv.Stats(0); st.SequenceGaps != 2 || st.MissedEvents != 2 || st.ReplayedEvents != 2 {
			t.Errorf("Stats(0) = %+v; want 2 gaps, 2 missed, 2 replayed", st)
		}
	})
	t.Run("fluxer unretained event", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer})
		got := resumeAfter(t, srv, func() {
			publish(t, srv, 0, 1)
			srv.Publish(0, Event{Name: "TYPING_START", Unretained: true})
			publish(t, srv, 0, 1)
		}, same)
		if fmt.Sprint(got) != "[3 5]" {
			t.Fatalf("replayed %v; want [3 5]", got)
		}
		if st := srv.Stats(0); st.SequenceGaps != 1 || st.MissedEvents != 1 {
			t.Errorf("Stats(0) = %+v; want 1 gap of 1", st)
		}
	})
	t.Run("fluxer unretained event names", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer, UnretainedEvents: []string{"PRESENCE_UPDATE"}})
		got := resumeAfter(t, srv, func() {
			srv.Publish(0, Event{Name: "PRESENCE_UPDATE"})
			publish(t, srv, 0, 1)
		}, same)
		if fmt.Sprint(got) != "[4]" {
			t.Fatalf("replayed %v; want [4]", got)
		}
	})
	t.Run("fluxer heartbeat trims the replay buffer", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer})
		c := dial(t, srv, "")
		r, seq := c.start(srv, 0, 1)
		publish(t, srv, 0, 3)
		for range 3 {
			seq = c.expect(opDispatch, "MESSAGE_CREATE").seq()
		}
		c.heartbeat(seq)
		c.expect(opHeartbeatACK, "")
		if s := srv.Sessions(0); s[0].Retained != 0 || s[0].Acked != seq {
			t.Fatalf("after heartbeat %d: %+v; want nothing retained", seq, s[0])
		}
		c.closeWith(4000)
		waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 })
		// A client that resumes from before what it acknowledged is told
		// nothing, and the gap shows in the counters.
		c2 := dial(t, srv, "")
		c2.expect(opHello, "")
		c2.resume(r.SessionID, seq-2)
		c2.expect(opDispatch, "RESUMED")
		if st := srv.Stats(0); st.SequenceGaps != 1 || st.MissedEvents != 2 {
			t.Errorf("Stats(0) = %+v; want 1 gap of 2", st)
		}
	})
	t.Run("discord refuses a resume it cannot replay", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{ReplayLimit: 2})
		got := resumeAfter(t, srv, func() { publish(t, srv, 0, 3) }, same)
		if got != nil {
			t.Fatalf("replayed %v; want op 9", got)
		}
		if st := srv.Stats(0); st.FailedResumes != 1 || st.Resumes != 0 {
			t.Errorf("Stats(0) = %+v; want 1 failed resume", st)
		}
	})
	t.Run("discord heartbeat does not trim", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{})
		c := dial(t, srv, "")
		_, seq := c.start(srv, 0, 1)
		c.heartbeat(seq)
		c.expect(opHeartbeatACK, "")
		if s := srv.Sessions(0); s[0].Retained != 2 {
			t.Fatalf("Retained = %d; want 2", s[0].Retained)
		}
	})
}

func TestIdentifyRateLimit(t *testing.T) {
	t.Run("discord bucket", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{Shards: 2, HeartbeatInterval: time.Hour})
		a := dial(t, srv, "")
		a.start(srv, 0, 2)
		b := dial(t, srv, "")
		b.expect(opHello, "")
		b.identify(identifyOpts{shard: []int{1, 2}, intents: 0})
		if f := b.expect(opInvalidSession, ""); string(f.D) != "false" {
			t.Fatalf("op 9 d = %s; want false", f.D)
		}
		if st := srv.Stats(1); st.RefusedIdentifies != 1 || st.Identifies != 0 {
			t.Fatalf("Stats(1) = %+v; want 1 refused", st)
		}
		fc.Advance(5*time.Second - time.Millisecond)
		b.identify(identifyOpts{shard: []int{1, 2}, intents: 0})
		b.expect(opInvalidSession, "")
		fc.Advance(time.Millisecond)
		b.identify(identifyOpts{shard: []int{1, 2}, intents: 0})
		b.expect(opDispatch, "READY")
	})
	t.Run("discord max concurrency", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Shards: 4, MaxConcurrency: 2})
		for id := range 2 {
			c := dial(t, srv, "")
			c.start(srv, id, 4)
		}
		c := dial(t, srv, "")
		c.expect(opHello, "")
		c.identify(identifyOpts{shard: []int{2, 4}, intents: 0})
		c.expect(opInvalidSession, "")
	})
	t.Run("discord session start limit", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{SessionStartLimit: 2, HeartbeatInterval: time.Hour})
		remaining := func() int {
			var b struct {
				Limit struct {
					Remaining  int   `json:"remaining"`
					ResetAfter int64 `json:"reset_after"`
				} `json:"session_start_limit"`
			}
			if status := getJSON(t, srv.APIURL()+"/gateway/bot", "Bot sim-token", &b); status != 200 {
				return -status
			}
			return b.Limit.Remaining
		}
		a := dial(t, srv, "")
		a.start(srv, 0, 1)
		if got := remaining(); got != 1 {
			t.Fatalf("remaining = %d; want 1", got)
		}
		fc.Advance(5 * time.Second)
		b := dial(t, srv, "")
		b.start(srv, 0, 1)
		if got := remaining(); got != 0 {
			t.Fatalf("remaining = %d; want 0", got)
		}
		fc.Advance(5 * time.Second)
		c := dial(t, srv, "")
		c.expect(opHello, "")
		c.identify(identifyOpts{intents: 0})
		// Discord ends every session and resets the token.
		for _, x := range []*testClient{a, b, c} {
			x.expectClose(CloseAuthenticationFailed)
		}
		if got := remaining(); got != -401 {
			t.Fatalf("discovery after revocation = %d; want status 401", -got)
		}
		srv.SetToken("sim-token")
		if got := remaining(); got != 2 {
			t.Fatalf("remaining after SetToken = %d; want 2", got)
		}
	})
	t.Run("discord session start limit resets", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{SessionStartLimit: 2, SessionStartUsed: 2})
		var b struct {
			Limit struct {
				Remaining int `json:"remaining"`
			} `json:"session_start_limit"`
		}
		getJSON(t, srv.APIURL()+"/gateway/bot", "Bot sim-token", &b)
		if b.Limit.Remaining != 0 {
			t.Fatalf("remaining = %d; want 0", b.Limit.Remaining)
		}
		fc.Advance(24 * time.Hour)
		getJSON(t, srv.APIURL()+"/gateway/bot", "Bot sim-token", &b)
		if b.Limit.Remaining != 2 {
			t.Fatalf("remaining after reset_after = %d; want 2", b.Limit.Remaining)
		}
	})
	t.Run("fluxer budget drops silently", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{Flavor: Fluxer, IdentifyBudget: 2, HeartbeatInterval: time.Hour})
		for range 2 {
			c := dial(t, srv, "")
			c.start(srv, 0, 1)
		}
		c := dial(t, srv, "")
		c.expect(opHello, "")
		c.identify(identifyOpts{})
		// Commands are handled in order, so an ACK before any READY proves
		// the identify was dropped.
		c.heartbeat(-1)
		c.expect(opHeartbeatACK, "")
		if st := srv.Stats(0); st.RefusedIdentifies != 1 || st.Identifies != 2 {
			t.Fatalf("Stats(0) = %+v; want 2 identifies, 1 refused", st)
		}
		fc.Advance(60 * time.Second)
		c.identify(identifyOpts{})
		c.expect(opDispatch, "READY")
	})
}

func TestCompression(t *testing.T) {
	tests := []struct {
		name   string
		flavor Flavor
		query  string
		prefix []byte // first bytes of the first message
	}{
		{"discord zlib-stream", Discord, "compress=zlib-stream", []byte{0x78}},
		{"discord zstd-stream", Discord, "compress=zstd-stream", []byte{0x28, 0xb5, 0x2f, 0xfd}},
		{"fluxer zstd-stream", Fluxer, "compress=zstd-stream", []byte{0x28, 0xb5, 0x2f, 0xfd}},
		{"fluxer zstd-stream both directions", Fluxer, "compress=zstd-stream&stream=1", []byte{0x28, 0xb5, 0x2f, 0xfd}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: tt.flavor, Guilds: 3})
			c := dial(t, srv, tt.query)
			_, seq := c.start(srv, 0, 1)
			publish(t, srv, 0, 20)
			for i := range int64(20) {
				if f := c.expect(opDispatch, "MESSAGE_CREATE"); f.seq() != seq+1+i {
					t.Fatalf("s = %d; want %d", f.seq(), seq+1+i)
				}
			}
			c.heartbeat(seq + 20)
			c.expect(opHeartbeatACK, "")
			msgs := c.messages
			if !bytes.HasPrefix(msgs[0], tt.prefix) {
				t.Errorf("first message starts % x; want % x", msgs[0][:4], tt.prefix)
			}
			for i, m := range msgs {
				if i > 0 && bytes.HasPrefix(m, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
					t.Errorf("message %d starts a new zstd frame; want one frame per connection", i)
				}
				if c.compress == "zlib-stream" && !bytes.HasSuffix(m, []byte{0, 0, 0xff, 0xff}) {
					t.Errorf("message %d ends % x; want 00 00 ff ff", i, m[len(m)-4:])
				}
			}
		})
	}
	t.Run("fluxer compressed payload over 4096 bytes", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer})
		c := dial(t, srv, "compress=zstd-stream&stream=1")
		c.expect(opHello, "")
		// Compresses to far less than 4096 bytes.
		c.sendRaw([]byte(`{"op":1,"d":null,"pad":"` + strings.Repeat("x", 3*MaxPayload) + `"}`))
		c.expectClose(CloseDecodeError)
	})
	t.Run("fluxer stream=1 rejects uncompressed payloads", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Flavor: Fluxer})
		c := dial(t, srv, "compress=zstd-stream&stream=1")
		c.stream = false
		c.expect(opHello, "")
		c.heartbeat(-1)
		c.expectClose(CloseDecodeError)
	})
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name  string
		query string
		fault Fault
		check func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64)
	}{
		{"close 4000 keeps the session", "", Fault{Kind: FaultClose}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expectClose(CloseUnknownError)
			waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 })
			if len(srv.Sessions(0)) != 1 {
				t.Fatal("session gone after close 4000; want resumable")
			}
		}},
		{"close 4009 ends the session", "", Fault{Kind: FaultClose, Code: CloseSessionTimedOut}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expectClose(CloseSessionTimedOut)
			waitFor(t, srv, "session end", func() bool { return len(srv.Sessions(0)) == 0 })
		}},
		{"close without status", "", Fault{Kind: FaultCloseNoStatus}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expectClose(websocket.CloseNoStatusReceived)
		}},
		{"drop", "", Fault{Kind: FaultDrop}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			_, err := c.next()
			var ce *websocket.CloseError
			if err == nil || errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
				t.Fatalf("after drop: %v; want a transport error", err)
			}
			waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 && len(srv.Sessions(0)) == 1 })
		}},
		{"invalid session false", "", Fault{Kind: FaultInvalidSession}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			if f := c.expect(opInvalidSession, ""); string(f.D) != "false" {
				t.Fatalf("op 9 d = %s; want false", f.D)
			}
			waitFor(t, srv, "session end", func() bool { return len(srv.Sessions(0)) == 0 })
		}},
		{"invalid session true", "", Fault{Kind: FaultInvalidSession, Resumable: true}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64) {
			if f := c.expect(opInvalidSession, ""); string(f.D) != "true" {
				t.Fatalf("op 9 d = %s; want true", f.D)
			}
		}},
		{"reconnect", "", Fault{Kind: FaultReconnect}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expect(opReconnect, "")
		}},
		{"heartbeat request", "", Fault{Kind: FaultHeartbeatRequest}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64) {
			c.expect(opHeartbeat, "")
			c.heartbeat(seq)
			c.expect(opHeartbeatACK, "")
		}},
		{"garbage", "", Fault{Kind: FaultGarbage}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			mt, msg, err := c.raw()
			if err != nil || mt != websocket.BinaryMessage || json.Valid(msg) {
				t.Fatalf("got %d % x %v; want a binary non-JSON frame", mt, msg, err)
			}
		}},
		{"invalid JSON", "", Fault{Kind: FaultInvalidJSON}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			var se *json.SyntaxError
			if _, err := c.next(); !errors.As(err, &se) {
				t.Fatalf("next() = %v; want a JSON syntax error", err)
			}
		}},
		{"invalid JSON compressed", "compress=zstd-stream", Fault{Kind: FaultInvalidJSON}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			var se *json.SyntaxError
			if _, err := c.next(); !errors.As(err, &se) {
				t.Fatalf("next() = %v; want a JSON syntax error", err)
			}
		}},
		{"corrupt zlib", "compress=zlib-stream", Fault{Kind: FaultCorruptCompression}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			var ce flate.CorruptInputError
			if _, err := c.next(); !errors.As(err, &ce) {
				t.Fatalf("next() = %v; want an inflate error", err)
			}
		}},
		{"corrupt zstd", "compress=zstd-stream", Fault{Kind: FaultCorruptCompression}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			_, err := c.next()
			var ce *websocket.CloseError
			var se *json.SyntaxError
			if err == nil || errors.As(err, &ce) || errors.As(err, &se) {
				t.Fatalf("next() = %v; want a zstd error", err)
			}
		}},
		{"oversized", "", Fault{Kind: FaultOversized, Size: 1 << 20}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			_, msg, err := c.raw()
			if err != nil || len(msg) != 1<<20 || !json.Valid(msg) {
				t.Fatalf("got %d bytes, %v; want a valid 1 MiB payload", len(msg), err)
			}
		}},
		{"oversized past 10 MiB compressed", "compress=zlib-stream", Fault{Kind: FaultOversized}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			f := c.expect(opDispatch, "GUILD_MEMBERS_CHUNK")
			if last := c.messages[len(c.messages)-1]; len(f.D) < 10<<20 || len(last) > 1<<20 {
				t.Fatalf("d of %d bytes in a %d-byte message; want over 10 MiB from a small message", len(f.D), len(last))
			}
		}},
		{"second hello", "", Fault{Kind: FaultSecondHello}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expect(opHello, "")
		}},
		{"backwards sequence", "", Fault{Kind: FaultBackwardsSequence}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64) {
			if f := c.expect(opDispatch, "MESSAGE_CREATE"); f.seq() != seq-1 {
				t.Fatalf("s = %d; want %d", f.seq(), seq-1)
			}
		}},
		{"unknown opcode", "", Fault{Kind: FaultUnknownOpcode}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, _ int64) {
			c.expect(42, "")
		}},
		{"stop acks", "", Fault{Kind: FaultStopAcks}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64) {
			c.heartbeat(seq)
			waitFor(t, srv, "heartbeat", func() bool { return srv.Stats(0).Heartbeats == 1 })
			publish(t, srv, 0, 1)
			c.expect(opDispatch, "MESSAGE_CREATE")
			srv.ClearFaults(0)
			c.heartbeat(seq + 1)
			c.expect(opHeartbeatACK, "")
		}},
		{"delay", "", Fault{Kind: FaultDelay, Delay: 10 * time.Second}, func(t *testing.T, c *testClient, srv *Server, fc *clock.Fake, seq int64) {
			publish(t, srv, 0, 1)
			if s := srv.Sessions(0)[0]; s.Seq != seq+1 || s.Sent != seq {
				t.Fatalf("session %+v; want s %d assigned, %d sent", s, seq+1, seq)
			}
			fc.Advance(10 * time.Second)
			c.expect(opDispatch, "MESSAGE_CREATE")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, fc := newTestServer(t, Config{HeartbeatInterval: time.Hour})
			c := dial(t, srv, tt.query)
			_, seq := c.start(srv, 0, 1)
			waitFor(t, srv, "READY sent", func() bool { return srv.Sessions(0)[0].Sent == seq })
			if n := srv.Inject(0, tt.fault); n != 1 {
				t.Fatalf("Inject(0, %v) = %d; want 1", tt.fault, n)
			}
			tt.check(t, c, srv, fc, seq)
		})
	}
	t.Run("all shards", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2})
		a, b := dial(t, srv, ""), dial(t, srv, "")
		a.start(srv, 0, 2)
		b.start(srv, 1, 2)
		idle := dial(t, srv, "")
		idle.expect(opHello, "")
		if n := srv.Inject(AllShards, Fault{Kind: FaultSecondHello}); n != 3 {
			t.Fatalf("Inject(AllShards) = %d; want 3", n)
		}
		for _, c := range []*testClient{a, b, idle} {
			c.expect(opHello, "")
		}
	})
	t.Run("sticky fault reaches later connections", func(t *testing.T) {
		srv, fc := newTestServer(t, Config{HeartbeatInterval: time.Hour})
		srv.Inject(0, Fault{Kind: FaultStopAcks})
		c := dial(t, srv, "")
		_, seq := c.start(srv, 0, 1)
		c.heartbeat(seq)
		waitFor(t, srv, "heartbeat", func() bool { return srv.Stats(0).Heartbeats == 1 })
		publish(t, srv, 0, 1)
		c.expect(opDispatch, "MESSAGE_CREATE")
		_ = fc
	})
	t.Run("invalid session true then resume on the same socket", func(t *testing.T) {
		srv, _ := newTestServer(t, Config{})
		c := dial(t, srv, "")
		r, seq := c.start(srv, 0, 1)
		srv.Inject(0, Fault{Kind: FaultInvalidSession, Resumable: true})
		c.expect(opInvalidSession, "")
		c.resume(r.SessionID, seq)
		c.expect(opDispatch, "RESUMED")
	})
}

func TestDuplicateSessions(t *testing.T) {
	srv, fc := newTestServer(t, Config{HeartbeatInterval: time.Hour})
	a := dial(t, srv, "")
	a.start(srv, 0, 1)
	fc.Advance(5 * time.Second)
	b := dial(t, srv, "")
	b.start(srv, 0, 1)
	if st := srv.Stats(0); st.LiveSessions != 2 || st.MaxLiveSessions != 2 {
		t.Fatalf("Stats(0) = %+v; want 2 live, max 2", st)
	}
	if got := srv.Totals().MaxLiveSessions; got != 2 {
		t.Fatalf("Totals().MaxLiveSessions = %d; want 2", got)
	}
	// Both sessions receive every event: the duplicate a node must
	// prevent.
	publish(t, srv, 0, 1)
	a.expect(opDispatch, "MESSAGE_CREATE")
	b.expect(opDispatch, "MESSAGE_CREATE")
	a.closeWith(1000)
	waitFor(t, srv, "one session left", func() bool { return srv.Stats(0).LiveSessions == 1 })
	if st := srv.Stats(0); st.MaxLiveSessions != 2 || len(srv.Sessions(0)) != 1 {
		t.Fatalf("Stats(0) = %+v, %d sessions; want max 2 kept, 1 session", st, len(srv.Sessions(0)))
	}
}

func TestDrain(t *testing.T) {
	srv, fc := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2, HeartbeatInterval: time.Hour})
	obedient, stubborn := dial(t, srv, ""), dial(t, srv, "")
	obedient.start(srv, 0, 2)
	stubborn.start(srv, 1, 2)
	if n := srv.Drain(); n != 2 {
		t.Fatalf("Drain() = %d; want 2", n)
	}
	obedient.expect(opReconnect, "")
	stubborn.expect(opReconnect, "")
	obedient.closeWith(4000)
	waitFor(t, srv, "obedient gone", func() bool { return srv.Connections() == 1 })
	fc.Advance(srv.Config().ReconnectGrace)
	stubborn.expectClose(CloseUnknownError)
	waitFor(t, srv, "all detached", func() bool { return srv.Totals().LiveSessions == 0 })
	if len(srv.Sessions(0)) != 1 || len(srv.Sessions(1)) != 1 {
		t.Fatal("sessions gone after drain; want both resumable")
	}
}

func TestTraffic(t *testing.T) {
	srv, fc := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2, Guilds: 10, HeartbeatInterval: time.Hour,
		Traffic: Traffic{PerShard: 10, DirectMessages: 2, PayloadSize: 600}})
	a, b := dial(t, srv, ""), dial(t, srv, "")
	_, seqA := a.start(srv, 0, 2)
	_, seqB := b.start(srv, 1, 2)
	fc.Advance(time.Second)
	type msg struct {
		GuildID string `json:"guild_id"`
		Content string `json:"content"`
	}
	for i, c := range []*testClient{a, b} {
		guild, dm := 0, 0
		seq := []int64{seqA, seqB}[i]
		want := 10 + 2*(1-i) // direct messages go to shard 0
		for range want {
			f := c.expect(opDispatch, "MESSAGE_CREATE")
			if f.seq() != seq+1 {
				t.Fatalf("shard %d: s = %d; want %d", i, f.seq(), seq+1)
			}
			seq++
			var m msg
			if err := json.Unmarshal(f.D, &m); err != nil {
				t.Fatal(err)
			}
			if m.GuildID == "" {
				dm++
				continue
			}
			g, _ := strconv.ParseUint(m.GuildID, 10, 64)
			if ShardOf(g, 2) != i {
				t.Fatalf("shard %d got guild %d of shard %d", i, g, ShardOf(g, 2))
			}
			if len(f.D) < 550 || len(f.D) > 650 {
				t.Errorf("d of %d bytes; want about 600", len(f.D))
			}
			guild++
		}
		if guild != 10 || dm != want-10 {
			t.Errorf("shard %d: %d guild and %d direct messages; want 10 and %d", i, guild, dm, want-10)
		}
		c.heartbeat(seq)
		c.expect(opHeartbeatACK, "")
		if st := srv.Stats(i); st.Published != int64(want) {
			t.Errorf("Stats(%d).Published = %d; want %d", i, st.Published, want)
		}
	}
	srv.SetTraffic(Traffic{})
	fc.Advance(time.Second)
	a.heartbeat(-1)
	a.expect(opHeartbeatACK, "")
}

func TestTrafficHonoursIntents(t *testing.T) {
	srv, fc := newTestServer(t, Config{HeartbeatInterval: time.Hour, Traffic: Traffic{PerShard: 10}})
	c := dial(t, srv, "")
	c.expect(opHello, "")
	c.identify(identifyOpts{intents: IntentGuilds})
	c.expect(opDispatch, "READY")
	c.expect(opDispatch, "GUILD_CREATE")
	fc.Advance(time.Second)
	c.heartbeat(-1)
	c.expect(opHeartbeatACK, "")
}

func TestPublishGuildAndFlood(t *testing.T) {
	srv, _ := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2, Guilds: 4})
	a, b := dial(t, srv, ""), dial(t, srv, "")
	a.start(srv, 0, 2)
	_, seqB := b.start(srv, 1, 2)
	g := srv.Guilds(1, 2)[0]
	if n, err := srv.PublishGuild(g, Event{Name: "GUILD_UPDATE", Data: json.RawMessage(`{"id":"` + strconv.FormatUint(g, 10) + `"}`)}); n != 1 || err != nil {
		t.Fatalf("PublishGuild = %d, %v; want 1 session", n, err)
	}
	b.expect(opDispatch, "GUILD_UPDATE")
	if _, err := srv.Publish(0, Event{Name: "bad name"}); err == nil {
		t.Fatal("Publish with a lower-case name succeeded")
	}
	if n := srv.Flood(1, 1000); n != 1 {
		t.Fatalf("Flood = %d; want 1", n)
	}
	for i := int64(2); i <= 1001; i++ {
		if f := b.expect(opDispatch, "MESSAGE_CREATE"); f.seq() != seqB+i {
			t.Fatalf("flood s = %d; want %d", f.seq(), seqB+i)
		}
	}
	waitFor(t, srv, "flood sent", func() bool { return srv.Sessions(1)[0].Sent == seqB+1001 })
	if st := srv.Stats(1); st.Published != 1001 {
		t.Errorf("Published = %d; want 1001", st.Published)
	}
}

func TestCloseSendsGoingAway(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv, "")
	c.start(srv, 0, 1)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	c.expectClose(CloseGoingAway)
	if err := srv.Close(); err != nil {
		t.Fatalf("second Close() = %v", err)
	}
}

func TestRealClock(t *testing.T) {
	srv, err := New(Config{HeartbeatInterval: 500 * time.Millisecond, Traffic: Traffic{PerShard: 100, Tick: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := dial(t, srv, "")
	c.start(srv, 0, 1)
	c.expect(opDispatch, "MESSAGE_CREATE")
	c.expectClose(CloseSessionTimedOut)
}

func TestSlowClientIsDropped(t *testing.T) {
	srv, _ := newTestServer(t, Config{MaxQueuedFrames: 4, HeartbeatInterval: time.Hour})
	c := dial(t, srv, "")
	c.start(srv, 0, 1)
	// A delay holds frames in the queue as a client that stopped reading
	// would.
	srv.Inject(0, Fault{Kind: FaultDelay, Delay: time.Hour})
	publish(t, srv, 0, 5)
	if _, err := c.next(); err == nil {
		t.Fatal("next() = nil; want the connection dropped")
	}
	waitFor(t, srv, "detach", func() bool { return srv.Stats(0).LiveSessions == 0 && len(srv.Sessions(0)) == 1 })
}

func TestGlobalTraffic(t *testing.T) {
	srv, fc := newTestServer(t, Config{Shards: 2, MaxConcurrency: 2, HeartbeatInterval: time.Hour,
		Traffic: Traffic{Global: 20}})
	a, b := dial(t, srv, ""), dial(t, srv, "")
	a.start(srv, 0, 2)
	b.start(srv, 1, 2)
	fc.Advance(time.Second)
	waitFor(t, srv, "20 events written", func() bool { return srv.Totals().Dispatched == 4+20 })
	if got := srv.Totals().Published; got != 20 {
		t.Fatalf("Published = %d; want 20", got)
	}
	if ids := srv.ShardIDs(); fmt.Sprint(ids) != "[0 1]" {
		t.Fatalf("ShardIDs() = %v; want [0 1]", ids)
	}
}

func TestFaultKindNames(t *testing.T) {
	kinds := FaultKinds()
	if len(kinds) != int(FaultDelay) {
		t.Fatalf("FaultKinds() has %d kinds; want %d", len(kinds), FaultDelay)
	}
	for _, k := range kinds {
		got, err := ParseFaultKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseFaultKind(%q) = %v, %v; want %v", k.String(), got, err, k)
		}
	}
	if _, err := ParseFaultKind("meteor"); err == nil {
		t.Error(`ParseFaultKind("meteor") succeeded`)
	}
}

// TestBotOutgrowsItsPlan: sessions of two totals at once, and a bot that
// grows past 2,500 guilds on a shard of the smaller plan: SetGuilds
// closes that session 4011 and leaves the larger plan's alone.
func TestBotOutgrowsItsPlan(t *testing.T) {
	srv, fc := newTestServer(t, Config{Shards: 1, Guilds: 2000, HeartbeatInterval: time.Hour})
	old := dial(t, srv, "")
	old.start(srv, 0, 1)
	fc.Advance(5 * time.Second) // the identify bucket's interval
	bigger := dial(t, srv, "")
	bigger.start(srv, 0, 2)
	if st := srv.Stats(0); st.LiveSessions != 2 {
		t.Fatalf("Stats(0) = %+v; want the two plans' sessions live", st)
	}
	// A guild of shard 0 in both plans reaches both sessions.
	g := srv.Guilds(0, 2)[0]
	if n, err := srv.PublishGuild(g, Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"1"}`)}); err != nil || n != 2 {
		t.Fatalf("PublishGuild(%d) = %d, %v; want 2 sessions", g, n, err)
	}
	old.expect(opDispatch, "MESSAGE_CREATE")
	bigger.expect(opDispatch, "MESSAGE_CREATE")

	if n := srv.SetGuilds(3000); n != 1 {
		t.Fatalf("SetGuilds(3000) closed %d connections; want 1 (shard 0 of 1 has 3000 guilds, shard 0 of 2 has 1500)", n)
	}
	old.expectClose(CloseShardingRequired)
	if n, err := srv.PublishGuild(g, Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"2"}`)}); err != nil || n < 1 {
		t.Fatalf("PublishGuild(%d) after the close = %d, %v; want the larger plan still reached", g, n, err)
	}
	bigger.expect(opDispatch, "MESSAGE_CREATE")
	fc.Advance(5 * time.Second)
	again := dial(t, srv, "")
	again.expect(opHello, "")
	again.identify(identifyOpts{shard: []int{0, 1}, intents: IntentGuilds})
	again.expectClose(CloseShardingRequired)
}

func TestSetShardsReachesDiscovery(t *testing.T) {
	srv, _ := newTestServer(t, Config{Shards: 4})
	srv.SetShards(8)
	var body struct{ Shards int }
	if status := getJSON(t, srv.APIURL()+"/gateway/bot", "Bot sim-token", &body); status != 200 || body.Shards != 8 {
		t.Fatalf("discovery after SetShards(8) = %d, %d shards; want 200, 8", status, body.Shards)
	}
}
