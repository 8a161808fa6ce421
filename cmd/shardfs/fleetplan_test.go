package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	leaseetcd "github.com/shardfs/shardfs/lease/etcd"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// Issue 22 item 10: the plan key outlived the fleet, so "stop the fleet
// and start it with the new --total" ended in plan mismatch. shardfs
// fleet plan prints the plan, refuses to change it while a node runs
// (naming it), and writes the new total once none does, keeping the
// flavor.
func TestFleetPlanCommand(t *testing.T) {
	srv := etcdtest.Start(t)
	fleet := func(args ...string) (string, error) {
		var out, errb strings.Builder
		err := run(context.Background(), append([]string{"fleet", "plan", "--etcd", srv.Endpoint, "--bot", "b"}, args...), strings.NewReader(""), &out, &errb)
		return out.String(), err
	}
	if out, err := fleet(); err != nil || !strings.Contains(out, "no plan") {
		t.Fatalf("fleet plan on an empty bot = %q, %v; want no plan", out, err)
	}
	if _, err := fleet("--total", "4"); err == nil || !strings.Contains(err.Error(), "name the flavor") {
		t.Fatalf("fleet plan --total 4 without a plan or --flavor = %v; want it to ask for the flavor", err)
	}
	if out, err := fleet("--total", "4", "--flavor", "discord"); err != nil || !strings.Contains(out, "flavor discord total 4, was no plan") {
		t.Fatalf("fleet plan --total 4 --flavor discord = %q, %v", out, err)
	}
	m, err := leaseetcd.Join(etcdtest.Ctx(t, 10*time.Second), leaseetcd.Config{Client: srv.Client(), Bot: "b", Node: "n1", Plan: leaseetcd.Plan{Flavor: "discord", Total: 4}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet("--total", "8"); err == nil || !strings.Contains(err.Error(), "the fleet is running") || !strings.Contains(err.Error(), "(n1)") {
		t.Fatalf("fleet plan --total 8 while n1 runs = %v; want refused, naming n1", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := fleet("--total", "8")
	if err != nil || !strings.Contains(out, "flavor discord total 8, was flavor discord total 4") || !strings.Contains(out, "--total 8") {
		t.Fatalf("fleet plan --total 8 after n1 left = %q, %v", out, err)
	}
	if out, err := fleet(); err != nil || out != "bot b: flavor discord total 8\n" {
		t.Fatalf("fleet plan = %q, %v", out, err)
	}
	if err := run(context.Background(), []string{"fleet"}, strings.NewReader(""), new(strings.Builder), new(strings.Builder)); err == nil {
		t.Fatal("shardfs fleet without plan succeeded")
	}
}
