package node

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/journal"
)

// A Fluxer node's relay speaks Fluxer v1 to its clients. The client is a
// second node whose gateway client (package gateway, Fluxer flavor, with
// compress=zstd-stream&stream=1) takes the relay for Fluxer's gateway: it
// gets READY and the shard's GUILD_CREATEs, the messages the simulator
// publishes in order; after its connection is reset it resumes at the
// relay with each message once; and its presence update reaches the
// simulator on the shard's session.
func TestRelayFluxerFlavor(t *testing.T) {
	presence := make(chan int, 4)
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Fluxer, Shards: 1, Guilds: 3,
		OnFrame: func(f gatewaysim.Frame) {
			if f.Op == 3 {
				select {
				case presence <- f.Shard:
				default:
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	up, err := New(Config{Flavor: core.Fluxer, Token: "sim-token", GatewayURL: sim.GatewayURL() + "/?v=1&encoding=json",
		Plan: core.Range(2, 0, 1), Relay: true})
	if err != nil {
		t.Fatal(err)
	}
	up.Start()
	defer up.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { up.Relay.Serve(l) })
	defer wg.Wait()
	defer up.Relay.Close()

	bot, err := New(Config{Flavor: core.Fluxer, Token: "sim-token", GatewayURL: "ws://" + l.Addr().String() + "/?v=1&encoding=json",
		Compression: gateway.ZstdStream, Plan: core.Range(2, 1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	bot.Start()
	defer bot.Close()
	if err := waitReady(bot, time.Minute); err != nil {
		t.Fatal(err)
	}
	var guilds []string
	for _, g := range sim.Guilds(1, 2) {
		guilds = append(guilds, fmt.Sprint(g))
	}
	for n := range 20 {
		if _, err := sim.Publish(1, gatewaysim.Event{Name: "MESSAGE_CREATE",
			Data: []byte(fmt.Sprintf(`{"id":"%d","channel_id":"1","guild_id":"%s","content":"m%d","author":{"id":"5"}}`, 100+n, guilds[0], n))}); err != nil {
			t.Fatal(err)
		}
	}
	log := bot.Tree.DispatchLog(1)
	got := waitLines(t, log, func(b string) bool { return strings.Contains(b, `"m19"`) })
	var creates, msgs int
	for line := range strings.SplitSeq(strings.TrimSpace(got), "\n") {
		switch {
		case strings.Contains(line, `"t":"GUILD_CREATE"`):
			creates++
		case strings.Contains(line, `"t":"MESSAGE_CREATE"`):
			if !strings.Contains(line, fmt.Sprintf(`"m%d"`, msgs)) {
				t.Fatalf("message %d: %s; want m%d, in order, none twice", msgs, line, msgs)
			}
			msgs++
		}
	}
	if creates != len(guilds) || msgs != 20 {
		t.Errorf("the bot got %d GUILD_CREATEs and %d messages; want %d and 20", creates, msgs, len(guilds))
	}
	// The bot's connection ends (reset: close 4000) and it resumes at the
	// relay, where it connected (Fluxer has no resume URL); what was
	// published meanwhile comes once.
	if err := bot.Scheduler.ExecShard(1, "reset"); err != nil {
		t.Fatal(err)
	}
	for n := 20; n < 25; n++ {
		if _, err := sim.Publish(1, gatewaysim.Event{Name: "MESSAGE_CREATE",
			Data: []byte(fmt.Sprintf(`{"id":"%d","channel_id":"1","guild_id":"%s","content":"m%d","author":{"id":"5"}}`, 100+n, guilds[0], n))}); err != nil {
			t.Fatal(err)
		}
	}
	waitLines(t, bot.Scheduler.Events(), func(b string) bool { return strings.Contains(b, "event=resumed") })
	got = waitLines(t, log, func(b string) bool { return strings.Contains(b, `"m24"`) })
	for n := range 25 {
		if c := strings.Count(got, fmt.Sprintf(`"m%d"`, n)); c != 1 {
			t.Errorf("m%d is in the bot's dispatch %d times; want once", n, c)
		}
	}
	if cs := up.Relay.Clients(); len(cs) != 1 || cs[0].Resumes != 1 {
		t.Errorf("relay clients %+v; want the bot's one session, resumed once", cs)
	}
	if err := bot.Scheduler.Send(1, []byte(`{"op":3,"d":{"status":"online","since":null,"activities":[],"afk":false}}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case shard := <-presence:
		if shard != 1 {
			t.Errorf("presence on shard %d; want 1", shard)
		}
	case <-time.After(time.Minute):
		t.Fatal("the bot's presence update never reached the simulator")
	}
	if tot := sim.Totals(); tot.Identifies != 2 {
		t.Errorf("the simulator saw %d identifies; want 2 (the upstream node's; the bot's stays at the relay)", tot.Identifies)
	}
}

// waitLines waits until the log's content satisfies done, and returns it.
func waitLines(t *testing.T, l *journal.Log, done func(string) bool) string {
	t.Helper()
	bound := time.After(time.Minute)
	for {
		ch := l.Notify()
		b := make([]byte, l.Size())
		n, _ := l.ReadAt(b, 0)
		if done(string(b[:n])) {
			return string(b[:n])
		}
		select {
		case <-ch:
		case <-bound:
			t.Fatalf("timed out; the log holds:\n%s", b[:n])
		}
	}
}
