package interop

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/disgoorg/disgo/discord"
	"github.com/disgoorg/disgo/gateway"
	"github.com/disgoorg/disgo/sharding"
	"go.uber.org/goleak"
)

// disgo, unchanged but for its gateway URL, logs in through the relay
// with zlib-stream, gets READY with its shard's guilds and their
// GUILD_CREATEs, 1,000 MESSAGE_CREATEs in order, and its presence update
// reaches the shard's session at the simulator.
func TestDisgoThroughRelay(t *testing.T) {
	if raceEnabled && os.Getenv(disgoChildEnv) == "" {
		runWithoutRace(t, "TestDisgoThroughRelay", disgoChildEnv)
		return
	}
	leakedBefore := goroutinesAt(disgoHeartbeat)
	t.Cleanup(func() {
		verifyNoLeaks(t, goleak.IgnoreTopFunction(disgoHeartbeat))
		if n := goroutinesAt(disgoHeartbeat) - leakedBefore; n > 1 {
			t.Errorf("disgo leaked %d heartbeat goroutines", n)
		}
	})
	rec := newRecorder()
	r := newRelayRig(t, rec)
	log := newTestLog(t, rec)
	// The relay's heartbeat interval is Discord's 41.25 s: disgo's ticker
	// (see testDisgo for why it must not fire) does not fire in this test.
	m := sharding.New(token, disgoHandler(rec),
		sharding.WithShardCount(2),
		sharding.WithShardIDs(1),
		sharding.WithLogger(log),
		sharding.WithGatewayConfigOpts(
			gateway.WithURL("ws"+r.url[len("http"):]),
			gateway.WithCompress(true),
			gateway.WithIntents(gateway.IntentGuilds, gateway.IntentGuildMessages, gateway.IntentMessageContent),
			gateway.WithLogger(log),
		),
	)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := m.OpenShard(ctx, 1); err != nil {
		t.Fatalf("OpenShard(1): %v", err)
	}
	defer m.Close(context.Background())
	want := guildIDs(r.sim.Guilds(1, 2))
	rec.until(t, "READY and every GUILD_CREATE", func(rc *recorder) bool {
		if len(rc.readies) < 1 {
			return false
		}
		for _, g := range want {
			if rc.guilds[g] == 0 {
				return false
			}
		}
		return true
	})
	rec.view(func(rc *recorder) {
		if got := len(rc.readies[0].Guilds); got != len(want) {
			t.Errorf("READY with %d guilds; want %d", got, len(want))
		}
	})
	r.publish(t, 1, 1000, markerPrefix)
	rec.until(t, "1,000 messages", func(rc *recorder) bool { return len(rc.order) >= 1000 })
	rec.view(func(rc *recorder) {
		for i, m := range rc.order {
			if m != fmt.Sprintf("%s%d", markerPrefix, i) {
				t.Fatalf("message %d is %q; want %s%d (in order, none missing or doubled)", i, m, markerPrefix, i)
			}
		}
		if len(rc.order) != 1000 {
			t.Errorf("%d messages; want 1,000", len(rc.order))
		}
		if len(rc.problems) > 0 {
			t.Errorf("disgo reported problems: %q", rc.problems)
		}
	})
	status := "relayed"
	if err := m.Shard(1).Send(ctx, gateway.OpcodePresenceUpdate, gateway.MessageDataPresenceUpdate{Status: "online", Activities: []discord.Activity{{Name: status}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case shard := <-r.presence:
		if shard != "1" {
			t.Errorf("presence update on shard %s's session; want 1", shard)
		}
	case <-ctx.Done():
		t.Fatal("the simulator saw no presence update")
	}
}
