package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/demo"
	"github.com/shardfs/shardfs/fsrv"
)

// startNode runs two shards against the gateway simulator and serves
// their tree on a unix socket, as `shardfs demo` does; a program would
// dial a node that is already running instead.
func startNode(sock string) (stop func()) {
	d, err := demo.Start(context.Background(), demo.Config{Shards: 2, Traffic: -1})
	if err != nil {
		log.Fatal(err)
	}
	l, err := fsrv.Listen("unix!" + sock)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, l) }()
	// Wait for both shards' sessions, so that status is the same on
	// every run.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	err = d.Wait(wctx, func() bool {
		for id := range 2 {
			if diag, _ := d.Node.Scheduler.Diag(id); diag.State != core.Ready {
				return false
			}
		}
		return true
	})
	if err != nil {
		log.Fatal(err)
	}
	return func() { cancel(); <-served; d.Close() }
}

// Read a node's status: one line per shard, its id and state first.
func Example() {
	dir, err := os.MkdirTemp("", "shardfs-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "node.sock")
	stop := startNode(sock)
	defer stop()

	c, err := client.Dial(context.Background(), "unix!"+sock)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	status, err := c.ReadFile("status")
	if err != nil {
		log.Fatal(err)
	}
	// The other columns (sequence, reconnects, latency) move with
	// the traffic.
	for _, line := range strings.Split(strings.TrimSpace(string(status)), "\n") {
		f := strings.Fields(line)
		fmt.Println(f[0], f[1])
	}
	// Output:
	// 0 READY
	// 1 READY
}
