// Command etcdchild is one etcd server of a test's cluster (soak.Cluster):
// a binary built without the race detector, so that a test run under
// -race still gets members as fast as a real etcd's (BuildEtcd).
package main

import (
	"fmt"
	"os"

	"github.com/shardfs/shardfs/soak"
)

func main() {
	soak.MaybeRunEtcd()
	fmt.Fprintln(os.Stderr, "etcdchild: run by soak.Etcd only ("+soak.EtcdEnv+" is not set)")
	os.Exit(2)
}
