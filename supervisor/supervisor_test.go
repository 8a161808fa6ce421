package supervisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
)

// The token never leaves a Config through fmt or slog.
func TestConfigHidesToken(t *testing.T) {
	const token = "MTIzNDU2Nzg5MDEyMzQ1Njc4.secret.token"
	cfg := Config{Flavor: core.Discord, Token: token, Plan: core.Plan{Total: 4, Local: []int{0, 1}}}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "cfg", cfg)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "cfg", cfg)
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%s", cfg), fmt.Sprintf("%q", cfg), logged.String()} {
		if strings.Contains(s, "secret") {
			t.Errorf("the token shows: %s", s)
		}
		if !strings.Contains(s, "redacted") {
			t.Errorf("no trace of the token's place: %s", s)
		}
	}
}
