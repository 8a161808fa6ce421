package node

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// fleetNode starts one node of bot "b" against sim and etcd.
func fleetNode(t *testing.T, cli *clientv3.Client, sim *gatewaysim.Server, name string, total, mc int, opts ...func(*Etcd)) *Node {
	t.Helper()
	e := &Etcd{Client: cli, Bot: "b", Node: name}
	for _, o := range opts {
		o(e)
	}
	s, err := New(Config{
		Flavor: core.Discord, Token: "sim-token", GatewayURL: sim.GatewayURL(),
		Plan: core.Range(total, 0, total-1), MaxConcurrency: mc,
		Logger: slog.New(slog.NewTextHandler(testWriter{t, name}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Etcd:   e,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Start()
	return s
}

type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(w.name + ": " + strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// within polls cond at the process boundary (a real etcd, real sockets),
// with a bound.
func within(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", bound, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readyOwned counts the shards s owns that are READY.
func readyOwned(s *Node) int {
	n := 0
	for _, d := range s.Node.Snapshot(nil) {
		if d.Owned() && d.State == core.Ready {
			n++
		}
	}
	return n
}

// messageIDs returns the ids of the MESSAGE_CREATE lines of a dispatch log.
func messageIDs(t *testing.T, l *journal.Log) []string {
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	var ids []string
	for _, line := range bytes.Split(buf[:n], []byte("\n")) {
		var ev struct {
			T string `json:"t"`
			D struct {
				ID string `json:"id"`
			} `json:"d"`
		}
		if len(line) == 0 || json.Unmarshal(line, &ev) != nil || ev.T != "MESSAGE_CREATE" {
			continue
		}
		ids = append(ids, ev.D.ID)
	}
	return ids
}

// A planned handover by drain: node a owns all 8 shards, b joins (a hands
// b its rendezvous share), then a drains. Messages published to every
// shard all along arrive exactly once in the union of the two nodes'
// /dispatch, each shard's after its move in b's, by resume: the simulator
// counts no identify after a's first 8 and never two live sessions of one
// shard. The tree files show the outcome.
func TestFleetHandoverByResume(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 8, MaxConcurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() }) // after the nodes' Close
	a := fleetNode(t, cli, sim, "a", 8, 8)
	within(t, 60*time.Second, "a: 8 shards READY", func() bool { return readyOwned(a) == 8 })

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	published := map[int][]string{}
	var pmu sync.Mutex
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			for id := range 8 {
				mid := fmt.Sprintf("m-%d-%d", id, i)
				n, err := sim.Publish(id, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"` + mid + `"}`)})
				if err == nil && n > 0 {
					pmu.Lock()
					published[id] = append(published[id], mid)
					pmu.Unlock()
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	b := fleetNode(t, cli, sim, "b", 8, 8)
	within(t, 60*time.Second, "b to take its share", func() bool { return readyOwned(b) > 0 && readyOwned(a)+readyOwned(b) == 8 })
	ctl := a.Tree.Root().Lookup("ctl").(*fsrv.Ctl)
	if err := ctl.Handle("drain now"); err == nil || !strings.Contains(err.Error(), "drain takes no argument") {
		t.Fatalf("drain with an argument = %v; want a refusal", err)
	}
	if err := ctl.Handle("drain"); err != nil {
		t.Fatalf("drain on /ctl: %v", err)
	}
	if err := a.Fleet.Drain(context.Background()); err != nil { // waits for the drain /ctl started
		t.Fatalf("drain: %v", err)
	}
	within(t, 60*time.Second, "b: 8 shards READY", func() bool { return readyOwned(b) == 8 })
	stop()
	wg.Wait()
	// Everything published has reached b's sink.
	within(t, 30*time.Second, "b's dispatch logs to catch up", func() bool {
		pmu.Lock()
		defer pmu.Unlock()
		for id := range 8 {
			got := messageIDs(t, b.Tree.DispatchLog(id))
			if len(got) == 0 || got[len(got)-1] != published[id][len(published[id])-1] {
				return false
			}
		}
		return true
	})
	for id := range 8 {
		seen := map[string]int{}
		for _, m := range append(messageIDs(t, a.Tree.DispatchLog(id)), messageIDs(t, b.Tree.DispatchLog(id))...) {
			seen[m]++
		}
		for _, m := range published[id] {
			if seen[m] != 1 {
				t.Fatalf("shard %d: message %s arrived %d times across the two nodes", id, m, seen[m])
			}
		}
		if len(seen) != len(published[id]) {
			t.Fatalf("shard %d: %d distinct messages arrived, %d published", id, len(seen), len(published[id]))
		}
	}
	var gaps []time.Duration
	for id := range 8 {
		stopped := lastTS(t, a, id, "event=stopped", "reason=moved")
		resumed := lastTS(t, b, id, "event=resumed")
		if !stopped.IsZero() && !resumed.IsZero() {
			gaps = append(gaps, resumed.Sub(stopped))
		}
	}
	slices.Sort(gaps)
	if len(gaps) == 0 {
		t.Fatal("no shard shows a move followed by a resume")
	}
	t.Logf("handover gap (a's stop to b's RESUMED), %d shards: min %v, median %v, max %v", len(gaps), gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1])
	tot := sim.Totals()
	if tot.Identifies != 8 || tot.Resumes < 8 || tot.MaxLiveSessions != 1 || tot.RefusedIdentifies != 0 {
		t.Fatalf("simulator: %d identifies, %d resumes, %d refused, at most %d live sessions a shard; want 8 identifies, every move a resume, never 2 live", tot.Identifies, tot.Resumes, tot.RefusedIdentifies, tot.MaxLiveSessions)
	}
	if got := strings.Count(file(t, b, "status"), "READY"); got != 8 {
		t.Fatalf("b's /status shows %d READY shards; want 8:\n%s", got, file(t, b, "status"))
	}
	if got := file(t, a, "status"); got != "" {
		t.Fatalf("the drained node's /status = %q; want empty (it owns nothing)", got)
	}
	within(t, 10*time.Second, "b's /members", func() bool { return file(t, b, "members") == "b 8\n" })
	owners := strings.Split(strings.TrimSpace(file(t, b, "owners")), "\n")
	if len(owners) != 8 || !strings.HasPrefix(owners[3], "3 b ") {
		t.Fatalf("b's /owners = %q", owners)
	}
	for _, want := range []string{"backend etcd\n", "node a\n", "state left\n", "moves 8\n"} {
		if !strings.Contains(file(t, a, "lease"), want) {
			t.Fatalf("a's /lease lacks %q:\n%s", want, file(t, a, "lease"))
		}
	}
}

// file is the content of a text file at the root of s's tree.
func file(t *testing.T, s *Node, name string) string {
	t.Helper()
	f, ok := s.Tree.Root().Lookup(name).(*fsrv.Text)
	if !ok {
		t.Fatalf("no text file /%s", name)
	}
	return string(f.Content())
}

// Two nodes with max_concurrency 1 start 8 shards together: the identify
// pacer across nodes (one bucket key in etcd) spaces their identifies so
// that the simulator, which refuses a second identify within its interval,
// refuses none. The key's lease is shortened to 3 s and the simulator's
// interval to 1 s so that the test takes about 25 s rather than 8 × 7 s;
// the spacing argument is the same: two identifies of the bucket are at
// least the key's lease minus the hold (1.5 s) apart, more than the
// interval (as 7 s − 1.5 s is more than Discord's 5 s).
// identifyShards is the size of TestFleetIdentifyAcrossNodes: 8 in CI
// (40 s of 5 s windows); the 32 by hand with
// -fleet.identify-shards 32 (160 s).
var identifyShards = flag.Int("fleet.identify-shards", 8, "shards of TestFleetIdentifyAcrossNodes")

func TestFleetIdentifyAcrossNodes(t *testing.T) {
	total := *identifyShards
	srv := etcdtest.Start(t)
	cli := srv.Client()
	sim, err := gatewaysim.New(gatewaysim.Config{Shards: total, MaxConcurrency: 1, IdentifyInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() }) // after the nodes' Close
	// The drain at Close is paced at one move per 5 s: bound it, the
	// test is about the start.
	short := func(e *Etcd) { e.IdentifyKeyTTL, e.DrainTimeout = 3*time.Second, time.Second }
	a := fleetNode(t, cli, sim, "a", total, 1, short)
	b := fleetNode(t, cli, sim, "b", total, 1, short)
	within(t, time.Duration(total)*5*time.Second+80*time.Second, fmt.Sprintf("%d shards READY across a and b", total), func() bool { return readyOwned(a)+readyOwned(b) == total })
	tot := sim.Totals()
	if tot.RefusedIdentifies != 0 || tot.MaxLiveSessions != 1 {
		t.Fatalf("simulator: %d identifies refused, at most %d live sessions a shard; want none refused, never 2", tot.RefusedIdentifies, tot.MaxLiveSessions)
	}
	if tot.Identifies < int64(total) {
		t.Fatalf("simulator counted %d identifies for %d shards", tot.Identifies, total)
	}
}

// lastTS is the time of the last line of shard id's events in s holding
// every one of subs, or zero.
func lastTS(t *testing.T, s *Node, id int, subs ...string) time.Time {
	l, err := s.Node.ShardEvents(id)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	var at time.Time
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		ok := strings.HasPrefix(line, "ts=")
		for _, sub := range subs {
			ok = ok && strings.Contains(line, sub)
		}
		if ok {
			ts, _, _ := strings.Cut(strings.TrimPrefix(line, "ts="), " ")
			at, _ = time.Parse(time.RFC3339Nano, ts)
		}
	}
	return at
}
