package soak

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// gwClient is a bare Discord client for the checks' test.
type gwClient struct {
	t  *testing.T
	ws *websocket.Conn
}

func gwDial(t *testing.T, sim *gatewaysim.Server) *gwClient {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(sim.GatewayURL()+"?v=10&encoding=json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	c := &gwClient{t: t, ws: ws}
	t.Cleanup(func() { ws.Close() })
	c.await(`"op":10`)
	return c
}

func (c *gwClient) send(s string) {
	c.t.Helper()
	if err := c.ws.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		c.t.Fatal(err)
	}
}

// await reads until a message containing want.
func (c *gwClient) await(want string) {
	c.t.Helper()
	_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, b, err := c.ws.ReadMessage()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", want, err)
		}
		if strings.Contains(string(b), want) {
			return
		}
	}
}

func (c *gwClient) identify(shard, total int) {
	c.t.Helper()
	c.send(fmt.Sprintf(`{"op":2,"d":{"token":%q,"intents":513,"shard":[%d,%d],"properties":{}}}`, token, shard, total))
	c.await(`"READY"`)
}

// The soak's checks fail when they should: a frame for a shard its sender
// does not own (by the etcd keys the watch saw) is a violation, one for a
// shard it owns is not, and two live sessions of one shard are reported.
// The sender here is this process, standing for a node.
func TestChecksCatch(t *testing.T) {
	ctx := context.Background()
	_, cli := StartEtcd(t)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	prefix := "/shardfs/" + bot + "/"
	own, err := watchOwners(wctx, cli, prefix, &wg)
	if err != nil {
		t.Fatal(err)
	}
	me := map[int]string{os.Getpid(): "node1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frames := newFrameLog(portOf(ln.Addr().String()), func() map[int]string { return me })
	// OnFrame runs after the server answered: a client's answer comes
	// before its frame is in the log, so the test waits for the log.
	logged := make(chan struct{}, 64)
	onFrame := func(f gatewaysim.Frame) { frames.add(f); logged <- struct{}{} }
	waitLogged := func(k int) {
		t.Helper()
		for range k {
			select {
			case <-logged:
			case <-time.After(10 * time.Second):
				t.Fatal("a frame never reached the log")
			}
		}
	}
	sim, err := gatewaysim.New(gatewaysim.Config{Listener: ln, Token: token, Shards: 4, MaxConcurrency: 4, IdentifyInterval: time.Millisecond, HeartbeatInterval: time.Hour, OnFrame: onFrame})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	c := &cluster{cfg: Config{}.withDefaults(), sim: sim, frames: frames, owners: own}
	node := &Process{Name: "node1"}

	put := func(k, v string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if v == "" {
			_, err = cli.Delete(pctx, prefix+k)
		} else {
			_, err = cli.Put(pctx, prefix+k, v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// waitOwner polls (the watch is another goroutine fed by etcd) until
	// the history shows the change.
	waitOwner := func(shard int, node string, want bool) {
		t.Helper()
		err := poll.Until(ctx, fmt.Sprintf("the watch showing %s owning shard %d = %v", node, shard, want), 10*time.Second, 20*time.Millisecond, func() error {
			now := time.Now()
			if own.ownedBetween(node, shard, now, now) != want {
				return fmt.Errorf("%s owning shard %d = %v", node, shard, !want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	put("shards/1", "node1")
	waitOwner(1, "node1", true)
	since := time.Now()
	a := gwDial(t, sim)
	a.identify(1, 4)
	a.send(`{"op":1,"d":1}`)
	a.await(`"op":11`)
	waitLogged(2)
	rep := &Report{}
	c.checkWake(rep, fault{kind: Pause, node: node, n: 1}, since)
	if rep.WakeFrames != 2 || len(rep.Violations) != 0 {
		t.Fatalf("frames for an owned shard: %d seen, violations %q; want 2 seen, none", rep.WakeFrames, rep.Violations)
	}

	put("shards/1", "")
	waitOwner(1, "node1", false)
	since = time.Now()
	a.send(`{"op":1,"d":1}`)
	a.await(`"op":11`)
	waitLogged(1)
	c.checkWake(rep, fault{kind: Pause, node: node, n: 2}, since)
	if len(rep.Violations) != 1 || !strings.Contains(rep.Violations[0], "heartbeat shard 1") {
		t.Fatalf("a heartbeat for a shard no longer owned: violations %q; want one naming the heartbeat of shard 1", rep.Violations)
	}

	// A second session of shard 1 at the gateway.
	b := gwDial(t, sim)
	b.identify(1, 4)
	waitLogged(1)
	c.checkDuplicates(rep, fault{kind: Kill, node: node, n: 3})
	if len(rep.Violations) != 2 || !strings.Contains(rep.Violations[1], "shard 1: 2") {
		t.Fatalf("two live sessions: violations %q; want the second to name shard 1", rep.Violations)
	}
	// After SIGCONT, a resume of a session the gateway does not know names
	// no shard: the woken node owns nothing, so it counts.
	since = time.Now()
	z := gwDial(t, sim)
	z.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":"gone","seq":3}}`, token))
	z.await(`"op":9`)
	waitLogged(1)
	c.checkWake(rep, fault{kind: Pause, node: node, n: 4}, since)
	if len(rep.Violations) != 3 || !strings.Contains(rep.Violations[2], "resume shard -1") {
		t.Fatalf("a resume naming no shard after SIGCONT: violations %q; want a third naming it", rep.Violations)
	}

	c.finish(rep)
	if rep.MaxLive != 2 || rep.Identifies != 2 || len(rep.ForeignFrames) == 0 || rep.UnknownFrames != 0 || rep.Err() == nil {
		t.Fatalf("report %+v; want max live 2, 2 identifies, foreign frames, every sender known, an error", rep)
	}
}
