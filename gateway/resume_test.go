package gateway

import (
	"slices"
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
	m := e.mark(0)
	e.sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	e.waitBackoff(0, m)
	e.simWait("the old connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
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
