package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Side names, as the report shows them.
const (
	sideShardfs   = "shardfs"
	sideDiscordgo = "discordgo"
	sideDisgo     = "disgo"
	sideDiod      = "diod"
)

// sim is a gateway simulator in its own process.
type sim struct {
	*child
	api, gateway string
	wire         wire // how its clients connect
}

func startSim(shards int, args ...string) (*sim, error) {
	return startSimOver(wire{}, shards, args...)
}

// startSimOver starts a simulator that serves over w's TLS, if any; the
// clients started against it connect as w says.
func startSimOver(w wire, shards int, args ...string) (*sim, error) {
	args = append([]string{"-shards", strconv.Itoa(shards)}, args...)
	if w.trust != nil {
		args = append(args, "-tls", w.trust.serverDir)
	}
	c, err := startChild("sim", args...)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(c.info)
	if len(f) != 2 {
		c.close()
		return nil, fmt.Errorf("sim: ready line %q", c.info)
	}
	return &sim{child: c, api: f[0], gateway: f[1], wire: w}, nil
}

// client is one side's gateway client in its own process: a shardfs node,
// discordgo sessions or disgo's shard manager.
type client struct {
	*child
	side   string
	shards int
	addr   string // a shardfs node's 9P address, after begin
	alias  string // its alias listener for diodload, if asked for
}

// startClient starts side's process against s for shards 0..n-1; nothing
// connects until begin.
func startClient(side string, s *sim, n, maxConcurrency int, extra ...string) (*client, error) {
	role := side
	args := []string{"-api", s.api, "-shards", strconv.Itoa(n)}
	switch side {
	case sideShardfs:
		role = "shardfs-node"
		if s.wire.compression != "" {
			args = append(args, "-compression", s.wire.compression)
		}
		// For profiling: e.g. SHARDFS_BENCH_NODE_FLAGS="-cpuprofile /tmp/node.pprof".
		extra = append(extra, strings.Fields(os.Getenv("SHARDFS_BENCH_NODE_FLAGS"))...)
	case sideDiscordgo, sideDisgo:
		args = append(args, "-gateway", s.gateway, "-max-concurrency", strconv.Itoa(maxConcurrency))
	default:
		return nil, fmt.Errorf("unknown side %q", side)
	}
	var env []string
	if s.wire.trust != nil {
		env = s.wire.trust.env()
	}
	c, err := startChildEnv(role, env, append(args, extra...)...)
	if err != nil {
		return nil, err
	}
	return &client{child: c, side: side, shards: n}, nil
}

// begin starts the shards: the node's start, the peers' open. Peers open
// shard by shard, so begin returns when the last one was opened (discordgo:
// READY; disgo: dialled).
func (c *client) begin(timeout time.Duration) error {
	if c.side == sideShardfs {
		out, err := c.call(timeout, "start")
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) >= 1 {
			c.addr = f[0]
		}
		if len(f) >= 2 {
			c.alias = f[1]
		}
		return nil
	}
	_, err := c.call(timeout, "open")
	return err
}

func (c *client) waitReady(n int, timeout time.Duration) error {
	_, err := c.call(timeout+10*time.Second, "wait-ready %d %v", n, timeout)
	return err
}

// usage is a client process's footprint after collect.
type usage struct {
	rss        int64
	goroutines int64
	heap       int64 // Go heap in use
	stack      int64 // goroutine stacks
}

// measure settles the client's memory (see collect) and reads it.
func (c *client) measure() (usage, error) {
	v, err := c.callInts(time.Minute, "gc")
	if err != nil {
		return usage{}, err
	}
	if len(v) != 3 {
		return usage{}, errors.New("gc: malformed answer")
	}
	r, err := rss(c.pid())
	return usage{rss: r, goroutines: v[0], heap: v[1], stack: v[2]}, err
}

func (c *client) count() (int64, error) {
	v, err := c.callInts(10*time.Second, "count")
	if err != nil {
		return 0, err
	}
	return v[0], nil
}
