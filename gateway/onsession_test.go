package gateway

import (
	"sync"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// TestOnSession: each new session reaches OnSession with its ID, resume
// URL and the READY sequence, once per shard.
func TestOnSession(t *testing.T) {
	var mu sync.Mutex
	got := map[int][]core.Session{}
	e := newEnv(t, envConfig{flavor: core.Discord, shards: 2, tr: func(c *Config, _ *gatewaysim.Server) {
		c.OnSession = func(shard int, s core.Session, seq int64) {
			mu.Lock()
			defer mu.Unlock()
			if seq < 1 {
				t.Errorf("shard %d: READY sequence %d", shard, seq)
			}
			got[shard] = append(got[shard], s)
		}
	}})
	e.start()
	mu.Lock()
	defer mu.Unlock()
	for shard := range 2 {
		if len(got[shard]) != 1 || got[shard][0].ID == "" || got[shard][0].ResumeURL == "" {
			t.Errorf("shard %d: OnSession got %d sessions (%v); want one with an ID and a resume URL", shard, len(got[shard]), got[shard])
		}
	}
}
