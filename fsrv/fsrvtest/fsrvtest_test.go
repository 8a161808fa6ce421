package fsrvtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/journal"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func text(name, s string) *fsrv.Text {
	return &fsrv.Text{Name: name, Content: func() []byte { return []byte(s) }}
}

func TestTreeOfEveryKind(t *testing.T) {
	events := journal.New(1 << 10)
	events.Append([]byte("ts=1 event=ready\n"), time.Unix(1796022000, 0))
	var shards []fsrv.File
	for i := range 3 {
		shards = append(shards, fsrv.NewDir(fmt.Sprint(i),
			text("state", "READY\n"),
			text("sequence", "none\n"),
			&fsrv.Ctl{Name: "ctl", Handle: func(string) error { return nil }, Usage: func() string { return "stop\nstart\n" }},
			&fsrv.Ctl{Name: "send", Handle: func(string) error { return nil }},
		))
	}
	root := &fsrv.Dir{
		List: func() []fsrv.File {
			return append([]fsrv.File{
				text("status", "0 READY 12 0 41\n"),
				&fsrv.LogFile{Name: "events", Source: events},
				text("empty", ""),
			}, shards...)
		},
	}
	// The nodes are made anew at every List above, which would change
	// their QID paths; a tree keeps them.
	list := root.List()
	root.List = func() []fsrv.File { return list }
	TestTree(t, root, "status", "events", "0/state", "2/ctl")
}
