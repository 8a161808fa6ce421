package node

import (
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/reshard"
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
	if got, want := ctl.Usage(), core.NodeUsage+reshard.Usage; got != want {
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

// A refused line on the node's /ctl gives the whole usage, reshard
// included, in its error and its events line.
func TestNodeCtlRefusalUsage(t *testing.T) {
	n, err := New(Config{Flavor: core.Discord, Token: "t", API: "http://127.0.0.1:1", Plan: core.Range(1, 0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctl := n.Server.Root.Lookup("ctl").(*fsrv.Ctl)
	err = ctl.Handle("frob all")
	if err == nil || !strings.HasSuffix(err.Error(), "| lease off | reshard N|auto") {
		t.Errorf("frob all = %v; want the usage with reshard", err)
	}
	l := n.Scheduler.Events()
	buf := make([]byte, l.Size())
	k, _ := l.ReadAt(buf, 0)
	if !strings.Contains(string(buf[:k]), `| reshard N|auto" `) && !strings.Contains(string(buf[:k]), `| reshard N|auto"`+"\n") {
		t.Errorf("events lack the usage with reshard:\n%s", buf[:k])
	}
}
