package gateway

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// The query of every URL the client connects to comes from its
// configuration alone: scheme, host and path from the URL, version,
// encoding and compression from Flavor and Compression.
func TestConnectURL(t *testing.T) {
	for _, tc := range []struct {
		flavor   core.Flavor
		compress Compression
		base     string
		want     string
	}{
		{core.Discord, NoCompression, "wss://gateway-us-east1-b.discord.gg", "wss://gateway-us-east1-b.discord.gg/?encoding=json&v=10"},
		{core.Discord, NoCompression, "wss://gateway-us-east1-b.discord.gg/?compress=zlib-stream", "wss://gateway-us-east1-b.discord.gg/?encoding=json&v=10"},
		{core.Discord, NoCompression, "wss://g.discord.gg/?v=9&encoding=etf&compress=zstd-stream&extra=1#frag", "wss://g.discord.gg/?encoding=json&v=10"},
		{core.Discord, ZlibStream, "wss://g.discord.gg/?compress=zstd-stream", "wss://g.discord.gg/?compress=zlib-stream&encoding=json&v=10"},
		{core.Discord, NoCompression, "wss://user:pw@g.discord.gg:443/resume?x=1", "wss://g.discord.gg:443/resume?encoding=json&v=10"},
		{core.Fluxer, NoCompression, "ws://127.0.0.1:5000?compress=zstd-stream&stream=1", "ws://127.0.0.1:5000/?encoding=json&v=1"},
		{core.Fluxer, ZstdStream, "wss://gateway.fluxer.app", "wss://gateway.fluxer.app/?compress=zstd-stream&encoding=json&stream=1&v=1"},
	} {
		tr, err := New(Config{Flavor: tc.flavor, Token: testToken, Compression: tc.compress})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tr.connectURL(tc.base)
		if err != nil || got != tc.want {
			t.Errorf("%v %q: connectURL(%q) = %q, %v; want %q", tc.flavor, tc.compress, tc.base, got, err, tc.want)
		}
		tr.Close()
	}
}

// A compress= in READY's resume_gateway_url on a connection configured
// without compression must not reach the resume: the gateway would then
// compress, the client would read garbage, and every resume would fail.
func TestResumeURLQueryIgnored(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.sim.SetResumeURL(e.sim.ResumeURL() + "?compress=zlib-stream&v=10&encoding=json")
	e.start()
	before := e.diag(0)
	m := e.drop(0)
	e.publish(0, 1)
	e.clk.Advance(5 * time.Second)
	e.waitEvent(0, m, "resumed")
	e.synced(0)
	if got, want := e.path(0, m), []string{"BACKOFF", "STARTING", "READY"}; !slices.Equal(got, want) {
		t.Errorf("path %v; want %v\nevents:\n%s", got, want, logText(e.events(0), m))
	}
	if d := e.diag(0); d.Reconnects != before.Reconnects+1 || d.Epoch != before.Epoch {
		t.Errorf("reconnects %d -> %d, epoch %d -> %d; want one reconnect and a resume", before.Reconnects, d.Reconnects, before.Epoch, d.Epoch)
	}
	e.sink.checkContiguous(t, 0)
}

// A resume carries the token, so it goes only to the gateway's own hosts.
func TestResumeTrusted(t *testing.T) {
	discord := "wss://gateway.discord.gg/"
	for _, tc := range []struct {
		resume, gateway string
		want            bool
	}{
		{"wss://gateway-us-east1-b.discord.gg", discord, true},
		{"wss://gateway.discord.gg:443/", discord, true},
		{"wss://GATEWAY-US-EAST1-B.Discord.GG./", discord, true},
		{"wss://discord.gg", discord, true},
		{"wss://evil.example/", discord, false},
		{"wss://discord.gg.evil.example/", discord, false},
		{"wss://evildiscord.gg/", discord, false},
		{"wss://gateway.discord.com/", discord, false},
		{"wss://192.0.2.1/", discord, false},
		{"wss://127.0.0.1:9999/", discord, false},
		{"ws://localhost:9999/", discord, false},
		{"wss://gateway.fluxer.app", "wss://gateway.fluxer.app", true},
		{"wss://eu.gateway.fluxer.app", "wss://gateway.fluxer.app", true},
		{"wss://fluxer.app.example", "wss://gateway.fluxer.app", false},
		{"wss://a.example.co.uk", "wss://gw.example.co.uk", true},
		{"wss://other.co.uk", "wss://gw.example.co.uk", false},
		{"wss://us.abc.io", "wss://gateway.abc.io", false}, // the strict side of the rule
		{"wss://us.gateway.abc.io", "wss://gateway.abc.io", true},
		// Loopback: the simulator or a local proxy, when the gateway is
		// there too; never dropping TLS.
		{"ws://127.0.0.1:5000/resume", "ws://127.0.0.1:5000/", true},
		{"ws://localhost:5001/", "ws://127.0.0.1:5000/", true},
		{"ws://127.0.0.1:5000/", "wss://127.0.0.1:5000/", false},
		{"wss://127.0.0.1:5000/", "ws://127.0.0.1:5000/", true},
		{"wss://192.0.2.1/", "ws://127.0.0.1:5000/", false},
		{"wss://192.0.2.1:8443/", "wss://192.0.2.1/", true},
		{"wss://192.0.2.2/", "wss://192.0.2.1/", false},
		{"wss://[::1]:5000/", "ws://127.0.0.1:5000/", true},
	} {
		u, err := wsURL(tc.resume)
		if err != nil {
			if tc.want {
				t.Errorf("wsURL(%q) = %v", tc.resume, err)
			}
			continue
		}
		g, _ := url.Parse(tc.gateway)
		if got := resumeTrusted(u, g); got != tc.want {
			t.Errorf("resumeTrusted(%q, gateway %q) = %v; want %v", tc.resume, tc.gateway, got, tc.want)
		}
	}
}

// A READY naming a resume host outside the gateway's domain gets no
// resume: the token is not sent there, not even dialled, and the next
// attempt identifies at the discovered URL. The refusal is logged once,
// however many sessions name the host.
func TestResumeUntrustedHost(t *testing.T) {
	const foreign = "192.0.2.1:443" // TEST-NET-1; the dial hook below keeps it off the network
	e := newEnv(t, envConfig{})
	var dmu sync.Mutex
	var dialled []string
	e.tr.dialer.Control = func(network, address string, _ syscall.RawConn) error {
		if address != foreign {
			return nil
		}
		dmu.Lock()
		dialled = append(dialled, address)
		dmu.Unlock()
		return errors.New("test: no traffic leaves loopback")
	}
	e.sim.SetResumeURL("wss://" + foreign + "/")
	e.start()
	for round := range 2 {
		before := e.diag(0)
		m := e.mark(0)
		e.sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
		off := e.waitBackoff(0, m)
		e.simWait("the old connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
		e.clk.Advance(5 * time.Second)
		off2 := e.waitBackoff(0, off)
		line := logText(e.events(0), off)[:off2-off]
		if !strings.Contains(line, "resume_gateway_url is not under the gateway's domain") || !strings.Contains(line, "192.0.2.1") {
			t.Errorf("round %d: backoff line %q; want the refused resume host", round, line)
		}
		e.clk.Advance(5 * time.Second)
		e.waitEvent(0, off2, "ready")
		e.synced(0)
		if d := e.diag(0); d.Epoch == before.Epoch || d.Identifies != before.Identifies+1 {
			t.Errorf("round %d: epoch %d -> %d, identifies %d -> %d; want a new session", round, before.Epoch, d.Epoch, before.Identifies, d.Identifies)
		}
	}
	dmu.Lock()
	defer dmu.Unlock()
	if len(dialled) != 0 {
		t.Errorf("dialled %v; want no connection to the foreign host", dialled)
	}
	if n := strings.Count(e.logs.String(), "refusing to resume"); n != 1 {
		t.Errorf("%d log lines about the refused host; want 1", n)
	}
	if s := e.sim.Stats(0); s.Resumes != 0 {
		t.Errorf("simulator saw %d resumes; want 0", s.Resumes)
	}
}
