package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

func TestCountGuilds(t *testing.T) {
	for _, f := range []core.Flavor{core.Discord, core.Fluxer} {
		flavor := gatewaysim.Discord
		if f == core.Fluxer {
			flavor = gatewaysim.Fluxer
		}
		// 0 and exact multiples of the page end on an empty page.
		for _, guilds := range []int{1, 199, 200, 401, 5001} {
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: flavor, Shards: 4, Guilds: guilds, Clock: clock.NewFake()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			client := &http.Client{Transport: &http.Transport{}}
			got, err := CountGuilds(ctx, client, f, sim.APIURL(), testToken)
			if err != nil || got != guilds {
				t.Errorf("%v: CountGuilds(%d guilds) = %d, %v; want %d", f, guilds, got, err, guilds)
			}
			client.CloseIdleConnections()
			cancel()
			sim.Close()
		}
	}
}

func TestCountGuildsRefuses(t *testing.T) {
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Fluxer, Guilds: 1000, Clock: clock.NewFake()})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, c := range []struct {
		name  string
		fault gatewaysim.GuildListFault
		token string
		want  string
	}{
		{"fails midway", gatewaysim.GuildListFault{FailAfter: 2}, testToken, "page 3 (after 400 guilds): answered 500"},
		{"loops", gatewaysim.GuildListFault{Loop: true}, testToken, "page 2 (after 200 guilds) does not move past guild"},
		{"token refused", gatewaysim.GuildListFault{}, "wrong-token-5678", "page 1 (after 0 guilds)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sim.SetGuildListFault(c.fault)
			got, err := CountGuilds(ctx, client, core.Fluxer, sim.APIURL(), c.token)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("CountGuilds = %d, %v; want an error saying %q", got, err, c.want)
			}
			if strings.Contains(err.Error(), c.token) {
				t.Errorf("CountGuilds error %q quotes the token", err)
			}
			if c.name == "token refused" && !errors.Is(err, ErrUnauthorized) {
				t.Errorf("CountGuilds(wrong token) = %v; want ErrUnauthorized", err)
			}
		})
	}
}
