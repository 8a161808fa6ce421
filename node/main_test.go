package node

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/soak"
)

// Every goroutine a node starts ends when Run returns. The binary doubles
// as an etcd server for the outage tests (soak.MaybeRunEtcd).
func TestMain(m *testing.M) {
	soak.MaybeRunEtcd()
	goleak.VerifyTestMain(m)
}
