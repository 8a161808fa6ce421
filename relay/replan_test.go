package relay

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/journal"
)

// After the node moves to a larger plan, the relay serves the new plan:
// the old plan's clients are closed 4011 with their sessions ended (a
// resume gets op 9), an identify with the old total gets 4011, discovery
// says the new total, and an identify with it is served from the new
// plan's journals and send path.
func TestReplan(t *testing.T) {
	r := newRig(t, 1, []int{0}, nil)
	r.shards[0].ready(2)
	old := r.dial("")
	id, seq := old.ready(0, 1, 2, allIntent)

	next := map[int]*shardLog{0: {id: 0, log: journal.New(1 << 20)}, 1: {id: 1, log: journal.New(1 << 20)}}
	newSends := make(chan sent, 4)
	if err := r.srv.Replan(2, []int{0, 1}, func(id int) *journal.Log { return next[id].log }, func(shard int, p []byte) error {
		newSends <- sent{shard, string(p)}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := old.closed(); got != 4011 {
		t.Errorf("the old plan's client: close %d; want 4011", got)
	}
	resume := r.dial("")
	resume.send(fmt.Sprintf(`{"op":6,"d":{"token":%q,"session_id":%q,"seq":%d}}`, testToken, id, seq))
	if f := resume.next(); f.Op != 9 || string(f.D) != "false" {
		t.Errorf("a resume of the old plan's session: op %d %s; want op 9 false", f.Op, f.D)
	}
	again := r.dial("")
	again.send(identify(testToken, 0, 1, allIntent))
	if got := again.closed(); got != 4011 {
		t.Errorf("an identify with the old total: close %d; want 4011", got)
	}

	req, _ := http.NewRequest("GET", strings.Replace(r.url, "ws://", "http://", 1)+"/api/v10/gateway/bot", nil)
	req.Header.Set("Authorization", "Bot "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct{ Shards int }
	json.NewDecoder(resp.Body).Decode(&d)
	if d.Shards != 2 {
		t.Errorf("discovery after the move: %d shards; want 2", d.Shards)
	}

	next[1].ready(1)
	c := r.dial("")
	c.ready(1, 2, 1, allIntent)
	next[1].message(0, 7)
	if f := c.next(); f.T != "MESSAGE_CREATE" || !strings.Contains(string(f.D), `"m7"`) {
		t.Fatalf("on the new plan: %s %s; want m7", f.T, f.D)
	}
	c.send(`{"op":3,"d":{"status":"idle","since":null,"activities":[],"afk":false}}`)
	select {
	case s := <-newSends:
		if s.shard != 1 || !strings.Contains(s.payload, `"idle"`) {
			t.Errorf("the new plan's send path got %+v; want the presence on shard 1", s)
		}
	case <-time.After(time.Minute):
		t.Fatal("the presence never reached the new plan's send path")
	}
	if s := r.sends(); len(s) != 0 {
		t.Errorf("the old plan's send path got %v; want nothing", s)
	}
	if ev := string(readAll(r.events)); !strings.Contains(ev, "event=relay-replan old_total=1 new_total=2 closed=1") {
		t.Errorf("events lack the replan line:\n%s", ev)
	}
}
