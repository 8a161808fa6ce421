package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/core"
	leaseetcd "github.com/shardfs/shardfs/lease/etcd"
	"github.com/shardfs/shardfs/node"
)

// fleetUsage is the usage line of the fleet command.
const fleetUsage = "usage: shardfs fleet plan --etcd URL,... --bot NAME [--total N [--flavor discord|fluxer]]"

// fleetTimeout bounds the fleet command's etcd calls.
const fleetTimeout = 30 * time.Second

// runFleet is "shardfs fleet plan": it prints the bot's plan in etcd, or
// with --total writes a new one while no node of the bot runs. Until a
// fleet moves to a new plan by itself (doc/reshard.md), this is how its
// total changes: stop every node, run it, start them with the new --total.
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) > 0 && args[0] == "plan":
		args = args[1:]
	case len(args) > 0 && strings.HasPrefix(args[0], "-"):
		// "shardfs fleet -h" describes plan's flags, its only command.
	default:
		return errors.New(fleetUsage)
	}
	fl := flag.NewFlagSet("fleet plan", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var conn etcdConn
	conn.register(fl)
	bot := fl.String("bot", "", "the bot's name, the folder of its keys in etcd")
	total := fl.Int("total", 0, "the new total of shards; without it, print the plan")
	flavor := fl.String("flavor", "", "with --total: the flavor (default: the plan's in etcd)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return fmt.Errorf("fleet plan: unexpected %q; %s", fl.Arg(0), fleetUsage)
	}
	if *conn.endpoints == "" || *bot == "" {
		return errors.New(fleetUsage)
	}
	if *total < 0 || *total > core.MaxTotal || (*total == 0 && *flavor != "") {
		return fmt.Errorf("fleet plan: --total %d --flavor %q; %s", *total, *flavor, fleetUsage)
	}
	if *flavor != "" {
		if _, err := core.ParseFlavor(*flavor); err != nil {
			return fmt.Errorf("--flavor: %w", err)
		}
	}
	var cfg node.Etcd
	if err := conn.config(&cfg); err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, TLS: cfg.TLS, Username: cfg.Username, Password: cfg.Password,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("--etcd: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, fleetTimeout)
	defer cancel()
	if *total == 0 {
		p, ok, err := leaseetcd.ReadPlan(ctx, cli, *bot)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(stdout, "bot %s has no plan in etcd (the first node writes it)\n", *bot)
			return nil
		}
		fmt.Fprintf(stdout, "bot %s: %s\n", *bot, p)
		return nil
	}
	want := leaseetcd.Plan{Flavor: *flavor, Total: *total}
	old, err := leaseetcd.SetPlan(ctx, cli, *bot, want)
	if err != nil {
		return fmt.Errorf("fleet plan: %w", err)
	}
	now, _, err := leaseetcd.ReadPlan(ctx, cli, *bot)
	if err != nil {
		return err
	}
	was := "no plan"
	if old.Total > 0 {
		was = old.String()
	}
	fmt.Fprintf(stdout, "bot %s: %s, was %s; start every node with --flavor %s --total %d\n", *bot, now, was, now.Flavor, now.Total)
	return nil
}
