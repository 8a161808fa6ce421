package core_test

import (
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
)

// The usage a ctl file shows lists every command its parser takes, and
// each usage line is a command the parser takes.
func TestUsageListsEveryCommand(t *testing.T) {
	inst := strings.NewReplacer("all|ID...", "all", "DURATION", "30s")
	for _, tc := range []struct {
		name  string
		usage string
		parse func(string) (core.Command, error)
	}{
		{"node", core.NodeUsage, core.ParseCommand},
		{"shard", core.ShardUsage, core.ParseShardCommand},
	} {
		for _, line := range strings.Split(strings.TrimSpace(tc.usage), "\n") {
			if _, err := tc.parse(inst.Replace(line)); err != nil {
				t.Errorf("%s usage line %q: %v", tc.name, line, err)
			}
		}
		for v := core.VerbReset; v.String() != "unknown"; v++ {
			if !strings.Contains("\n"+tc.usage, "\n"+v.String()+" ") && !strings.Contains("\n"+tc.usage, "\n"+v.String()+"\n") {
				t.Errorf("%s usage lacks %s, which the parser takes", tc.name, v)
			}
		}
		if _, err := tc.parse("frobnicate"); err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("%s: frobnicate = %v; want unknown command", tc.name, err)
		}
	}
}
