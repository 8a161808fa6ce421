package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// relayFrame is a gateway payload as a relay client reads it.
type relayFrame struct {
	Op int             `json:"op"`
	S  *int64          `json:"s"`
	T  string          `json:"t"`
	D  json.RawMessage `json:"d"`
}

// relayIdentify dials the relay at addr, identifies for shard of total
// and returns the connection; a close instead of Hello fails the test.
func relayIdentify(t *testing.T, addr string, shard, total int) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/?v=10&encoding=json", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	if f := relayNext(t, ws); f.Op != 10 {
		t.Fatalf("first frame op %d; want Hello", f.Op)
	}
	id := fmt.Sprintf(`{"op":2,"d":{"token":"sim-token","intents":%d,"shard":[%d,%d],"properties":{"os":"linux","browser":"t","device":"t"}}}`, 1|1<<9|1<<15, shard, total)
	if err := ws.WriteMessage(websocket.TextMessage, []byte(id)); err != nil {
		t.Fatal(err)
	}
	return ws
}

func relayRead(ws *websocket.Conn) (relayFrame, error) {
	ws.SetReadDeadline(time.Now().Add(time.Minute)) // a hang's bound
	var f relayFrame
	_, msg, err := ws.ReadMessage()
	if err == nil {
		err = json.Unmarshal(msg, &f)
	}
	return f, err
}

func relayNext(t *testing.T, ws *websocket.Conn) relayFrame {
	t.Helper()
	f, err := relayRead(ws)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return f
}

// relayClosed reads until the close frame and returns its code.
func relayClosed(t *testing.T, ws *websocket.Conn) int {
	t.Helper()
	for {
		_, err := relayRead(ws)
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ce):
			return ce.Code
		case err != nil:
			t.Fatalf("read: %v; want a close frame", err)
		}
	}
}

// After the node moves to a larger plan, its relay serves the new plan:
// the client of the old plan is closed 4011 (a library asks discovery
// again), discovery says the new total, an identify with it gets READY
// with the new shard's guilds and then its messages, and the tree of the
// new plan still has /relay and /clients.
func TestRelayFollowsReshard(t *testing.T) {
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 1, MaxConcurrency: 2, Guilds: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	s, err := New(Config{Flavor: core.Discord, Token: "sim-token", GatewayURL: sim.GatewayURL(), Plan: core.Range(1, 0, 0),
		MaxConcurrency: 2, Intents: 1 | 1<<9 | 1<<15, Relay: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.Relay.Serve(l) })
	defer wg.Wait()
	defer s.Relay.Close()
	addr := l.Addr().String()

	old := relayIdentify(t, addr, 0, 1)
	if f := relayNext(t, old); f.T != "READY" {
		t.Fatalf("got %s; want READY", f.T)
	}
	if _, err := s.move.Command("reshard 2"); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, s, "event=reshard-switch", time.Minute)
	if got := relayClosed(t, old); got != 4011 {
		t.Errorf("the old plan's client: close %d; want 4011", got)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/api/v10/gateway/bot", nil)
	req.Header.Set("Authorization", "Bot sim-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Shards int }
	json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	if d.Shards != 2 {
		t.Errorf("discovery after the move: %d shards; want 2", d.Shards)
	}

	c := relayIdentify(t, addr, 1, 2)
	f := relayNext(t, c)
	var ready struct {
		Shard  []int
		Guilds []struct{ ID string }
	}
	json.Unmarshal(f.D, &ready)
	want := sim.Guilds(1, 2)
	if f.T != "READY" || fmt.Sprint(ready.Shard) != "[1 2]" || len(ready.Guilds) != len(want) {
		t.Fatalf("after the move: %s %s; want READY for [1,2] with %d guilds", f.T, f.D, len(want))
	}
	for range want {
		if f := relayNext(t, c); f.T != "GUILD_CREATE" {
			t.Fatalf("got %s; want GUILD_CREATE", f.T)
		}
	}
	if _, err := sim.PublishGuild(want[0], gatewaysim.Event{Name: "MESSAGE_CREATE",
		Data: []byte(fmt.Sprintf(`{"id":"9","channel_id":"1","guild_id":"%d","content":"after","author":{"id":"5"}}`, want[0]))}); err != nil {
		t.Fatal(err)
	}
	if f := relayNext(t, c); f.T != "MESSAGE_CREATE" || !strings.Contains(string(f.D), `"after"`) {
		t.Fatalf("got %s %s; want the message published after the move", f.T, f.D)
	}
	_, tree := s.Current()
	for _, name := range []string{"relay", "clients"} {
		if tree.Root().Lookup(name) == nil {
			t.Errorf("the new plan's tree has no /%s", name)
		}
	}
	if ev := string(readLog(s.events)); !strings.Contains(ev, "event=relay-replan old_total=1 new_total=2") {
		t.Errorf("the events lack the relay's replan line:\n%s", ev)
	}
}
