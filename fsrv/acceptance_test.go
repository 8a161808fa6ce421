package fsrv_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/fsrv/fsrvtest"
	"github.com/shardfs/shardfs/journal"
)

// TestAcceptance runs the acceptance suite on a tree shaped like the one
// shardfs serves, with a directory that looks its entries up instead of
// listing them.
func TestAcceptance(t *testing.T) {
	events := journal.New(4 << 10)
	for i := range 100 {
		events.Append(fmt.Appendf(nil, "ts=%d event=tick\n", i), time.Unix(1796022000, 0))
	}
	shards := map[string]*fsrv.Dir{}
	var list []fsrv.File
	for i := range 4 {
		name := strconv.Itoa(i)
		d := fsrv.NewDir(name,
			&fsrv.Text{Name: "state", Content: func() []byte { return []byte("READY\n") }},
			&fsrv.Ctl{Name: "ctl", Handle: func(string) error { return nil }, Usage: func() string { return "stop\n" }},
			&fsrv.Ctl{Name: "send", Handle: func(string) error { return nil }},
			&fsrv.LogFile{Name: "events", Source: events},
		)
		shards[name] = d
		list = append(list, d)
	}
	root := &fsrv.Dir{
		List:   func() []fsrv.File { return list },
		Lookup: func(name string) fsrv.File { return shards[name] },
	}
	fsrvtest.TestTree(t, root, "0/state", "3/events", "1/ctl")
}
