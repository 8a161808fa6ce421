package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"3.5.13", true}, {"3.5.14", true}, {"3.6.0", true}, {"3.7.3", true}, {"4.0.0", true},
		{"3.5.12", false}, {"3.4.23", false}, {"3.4.99", false}, {"2.3.8", false},
		{"3.5.13-rc.0", true}, {"", false}, {"3.5", false}, {"x.y.z", false},
	} {
		if got := versionAtLeast(c.v, MinVersion); got != c.want {
			t.Errorf("versionAtLeast(%q, %s) = %v; want %v", c.v, MinVersion, got, c.want)
		}
	}
}

// Issue 21 item 5: an etcd older than 3.5.13 (Debian ships 3.4.23) is
// refused at join, naming the version; the embedded server of the tests
// (3.7) passes, through its real Status.
func TestJoinRefusesOldEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	plan := Plan{Flavor: "discord", Total: 4}
	cfg := Config{Client: cli, Bot: "b", Node: "a", Plan: plan, Logger: discard(),
		versionOf: func(context.Context, string) (string, error) { return "3.4.23", nil }}
	_, err := Join(etcdtest.Ctx(t, 10*time.Second), cfg)
	if !errors.Is(err, ErrEtcdTooOld) || !strings.Contains(err.Error(), "3.4.23") || !strings.Contains(err.Error(), MinVersion) {
		t.Fatalf("Join against etcd 3.4.23 = %v; want ErrEtcdTooOld naming both versions", err)
	}
	if r, _ := cli.Get(context.Background(), "/shardfs/b/", clientv3.WithPrefix()); len(r.Kvs) != 0 {
		t.Fatalf("a refused join wrote %d keys", len(r.Kvs))
	}
	cfg.versionOf = nil
	m, err := Join(etcdtest.Ctx(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatalf("Join against the embedded etcd = %v", err)
	}
	m.Close()
}

// Issue 22 item 10: the plan of a fleet changes only while no node runs:
// SetPlan refuses while a member key lives, naming it, and writes the new
// total (keeping the flavor) once the fleet is gone; a node of the old
// total is then refused, one of the new total joins.
func TestSetPlanOnlyWhileNoNodeRuns(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	ctx := etcdtest.Ctx(t, 30*time.Second)
	if _, err := SetPlan(ctx, cli, "b", Plan{Total: 8}); !errors.Is(err, ErrBadPlan) {
		t.Fatalf("SetPlan without a flavor on a bot with no plan = %v; want ErrBadPlan", err)
	}
	old := Plan{Flavor: "discord", Total: 4}
	m, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: old, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SetPlan(ctx, cli, "b", Plan{Total: 8}); !errors.Is(err, ErrFleetRunning) || !strings.Contains(err.Error(), "(a)") {
		t.Fatalf("SetPlan while node a runs = %v; want ErrFleetRunning naming a", err)
	}
	if p, ok, err := ReadPlan(ctx, cli, "b"); err != nil || !ok || p != old {
		t.Fatalf("ReadPlan after a refused SetPlan = %v, %v, %v; want %v", p, ok, err, old)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	prev, err := SetPlan(ctx, cli, "b", Plan{Total: 8})
	if err != nil || prev != old {
		t.Fatalf("SetPlan with no node = %v, %v; want the old plan %v", prev, err, old)
	}
	if _, err := Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: old, Logger: discard()}); !errors.Is(err, ErrPlanMismatch) {
		t.Fatalf("Join with the old total = %v; want ErrPlanMismatch", err)
	}
	m, err = Join(ctx, Config{Client: cli, Bot: "b", Node: "a", Plan: Plan{Flavor: "discord", Total: 8}, Logger: discard()})
	if err != nil {
		t.Fatalf("Join with the new total = %v", err)
	}
	m.Close()
}
