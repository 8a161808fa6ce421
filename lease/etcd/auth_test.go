package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
)

// The role doc/fleet.md documents is enough, and no more: with etcd's
// authentication on and a user whose role is read-write on /shardfs/b/
// only (issue 21 item 5), a node joins (the version check included), owns
// every shard, and the user can neither read another bot's keys nor its
// plan.
func TestOwnershipWithPrefixRole(t *testing.T) {
	srv := etcdtest.Start(t)
	admin := srv.Client()
	ctx := etcdtest.Ctx(t, 2*time.Minute)
	if _, err := admin.Put(ctx, "/shardfs/other/plan", `{"flavor":"discord","total":1}`); err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "shardfs-b"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "shardfs-b", "/shardfs/b/", clientv3.GetPrefixRangeEnd("/shardfs/b/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "shardfs-b", "nodepw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "shardfs-b", "shardfs-b"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	// The dial authenticates, and etcd checks the password with bcrypt:
	// seconds under the race detector on a loaded machine.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: time.Minute,
		Username: "shardfs-b", Password: "nodepw", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	a := startOwnership(t, cli, "a", Plan{Flavor: "discord", Total: 4}, 4)
	waitFor(t, "a to own 4 shards under the prefix role", func() bool { return len(a.shards.owned(a.clk.Now())) == 4 })
	if _, err := cli.Get(ctx, "/shardfs/other/plan"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("reading another bot's plan as shardfs-b = %v; want permission denied", err)
	}
	if _, err := cli.Put(context.Background(), "/shardfs/bx", "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("writing beside the prefix as shardfs-b = %v; want permission denied", err)
	}
}
