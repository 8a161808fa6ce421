package node

import (
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

// The node's /ctl usage lists the core's commands and the node's own
// (reshard), and the node takes reshard: a bad argument gets reshard's
// refusal, not the core's unknown command.
func TestNodeCtlUsage(t *testing.T) {
	n, err := New(Config{Flavor: core.Discord, Token: "t", API: "http://127.0.0.1:1", Plan: core.Range(1, 0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctl := n.Server.Root.Lookup("ctl").(*fsrv.Ctl)
	if got, want := ctl.Usage(), core.NodeUsage+ReshardUsage; got != want {
		t.Errorf("/ctl usage = %q; want %q", got, want)
	}
	for _, line := range strings.Split(strings.TrimSpace(ctl.Usage()), "\n") {
		verb := strings.Fields(line)[0]
		err := ctl.Handle(verb + " junk-argument")
		if err == nil || strings.Contains(err.Error(), "unknown command") {
			t.Errorf("%s with a bad argument = %v; want the command's own refusal", verb, err)
		}
	}
}
