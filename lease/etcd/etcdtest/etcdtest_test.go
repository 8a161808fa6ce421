package etcdtest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartPutGet(t *testing.T) {
	s := Start(t)
	c := s.Client()
	ctx := Ctx(t, 10*time.Second)
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	r, err := c.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("Get(/k) = %v; want v", r.Kvs)
	}
}
