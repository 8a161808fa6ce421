package gateway

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// childSimEnv makes the test binary serve a simulator instead of running
// tests; the benchmarks start it so that their CPU and memory figures hold
// the client's work alone.
const childSimEnv = "SHARDFS_GATEWAY_CHILD_SIM"

// runChildSim serves a simulator on real time. It prints "ready API" and
// then obeys lines on stdin: "flood SHARD N" (answered "ok"); EOF ends it.
func runChildSim() int {
	shards, _ := strconv.Atoi(os.Getenv(childSimEnv + "_SHARDS"))
	cfg := gatewaysim.Config{
		Shards:            max(shards, 1),
		MaxConcurrency:    max(shards, 1),
		SessionStartLimit: 1 << 20,
		HeartbeatInterval: time.Hour,
	}
	if os.Getenv(childSimEnv) == "fluxer" {
		cfg.Flavor = gatewaysim.Fluxer
	}
	srv, err := gatewaysim.New(cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer srv.Close()
	fmt.Println("ready", srv.APIURL())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "flood" {
			id, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			fmt.Println("ok", srv.Flood(id, n))
		}
	}
	return 0
}

// childSim is a simulator running in a child process.
type childSim struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	api   string
}

func startChildSim(tb testing.TB, flavor core.Flavor, shards int) *childSim {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childSimEnv+"="+flavor.String(), childSimEnv+"_SHARDS="+strconv.Itoa(shards))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &childSim{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	line := c.line(tb)
	api, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		c.close()
		tb.Fatalf("child simulator: %q", line)
	}
	c.api = api
	return c
}

func (c *childSim) line(tb testing.TB) string {
	tb.Helper()
	if !c.out.Scan() {
		tb.Fatalf("child simulator ended: %v", c.out.Err())
	}
	return c.out.Text()
}

func (c *childSim) flood(tb testing.TB, shard, n int) {
	tb.Helper()
	fmt.Fprintf(c.stdin, "flood %d %d\n", shard, n)
	if got := c.line(tb); got != "ok 1" {
		tb.Fatalf("flood: %q; want one session flooded", got)
	}
}

func (c *childSim) close() {
	c.stdin.Close()
	_ = c.cmd.Wait()
}
