package gateway

import (
	"context"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
)

// The token travels unencrypted only to this machine.
func TestNoPlaintextTokenOffHost(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"ws://127.0.0.1:8080/", true}, {"ws://[::1]:8080/", true}, {"ws://localhost/", true},
		{"wss://gateway.discord.gg/", true}, {"ws://gateway.discord.gg/", false}, {"ws://10.0.0.1/", false},
	} {
		if _, err := wsURL(tc.url); (err == nil) != tc.ok {
			t.Errorf("wsURL(%q) = %v; want ok=%v", tc.url, err, tc.ok)
		}
	}
	_, err := Discover(context.Background(), nil, core.Discord, "http://discord.example/api/v10", "TOKEN-xyz")
	if err == nil || !strings.Contains(err.Error(), "use https") || strings.Contains(err.Error(), "TOKEN") {
		t.Errorf("Discover over plain http off host = %v; want a refusal without the token", err)
	}
}
