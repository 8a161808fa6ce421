package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrFleetRunning: SetPlan found a member or shard key of the bot: some
// node still runs (or its lease has not expired yet).
var ErrFleetRunning = errors.New("the fleet is running")

// ReadPlan returns the plan key of bot; false when there is none.
func ReadPlan(ctx context.Context, kv clientv3.KV, bot string) (Plan, bool, error) {
	if err := checkName("bot", bot); err != nil {
		return Plan{}, false, err
	}
	key := Prefix(bot) + "plan"
	r, err := kv.Get(ctx, key)
	if err != nil {
		return Plan{}, false, fmt.Errorf("etcd: read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return Plan{}, false, nil
	}
	p, err := decodePlan(key, r.Kvs[0].Value)
	return p, err == nil, err
}

// SetPlan writes bot's plan key while no node runs: no key under members/
// or shards/, checked in the same transaction as the write, so a node
// that joins meanwhile either finds the new plan or makes SetPlan fail.
// An empty flavor keeps the flavor of the plan in etcd. It returns the
// plan it replaced (zero when there was none). The sessions saved under
// the old plan stay: a node ignores a snapshot of another total.
//
// This is how a fleet's total changes until the fleet moves to a new plan
// by itself (doc/reshard.md): stop every node, SetPlan (shardfs fleet
// plan), start the nodes with the new --total.
func SetPlan(ctx context.Context, kv clientv3.KV, bot string, p Plan) (Plan, error) {
	old, had, err := ReadPlan(ctx, kv, bot)
	if err != nil && !errors.Is(err, ErrBadPlan) {
		return Plan{}, err
	}
	if p.Flavor == "" {
		if !had {
			return Plan{}, fmt.Errorf("%w: bot %s has no plan in etcd yet: name the flavor", ErrBadPlan, bot)
		}
		p.Flavor = old.Flavor
	}
	if err := p.check(); err != nil {
		return Plan{}, err
	}
	prefix := Prefix(bot)
	key := prefix + "plan"
	none := func(dir string) clientv3.Cmp {
		// A range compare over a folder with no key compares an absent
		// key, whose CreateRevision is 0; any key there fails it.
		return clientv3.Compare(clientv3.CreateRevision(prefix+dir), "=", 0).WithPrefix()
	}
	r, err := kv.Txn(ctx).
		If(none("members/"), none("shards/")).
		Then(clientv3.OpPut(key, p.encode())).
		Else(clientv3.OpGet(prefix+"members/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(prefix+"shards/", clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Commit()
	if err != nil {
		return Plan{}, fmt.Errorf("etcd: write %s: %w", key, err)
	}
	if !r.Succeeded {
		var members []string
		for _, kv := range r.Responses[0].GetResponseRange().GetKvs() {
			members = append(members, strings.TrimPrefix(string(kv.Key), prefix+"members/"))
		}
		shards := r.Responses[1].GetResponseRange().GetCount()
		return Plan{}, fmt.Errorf("%w: bot %s has %d members (%s) and %d shard keys in etcd; stop every node first (a killed node's keys go when its lease expires, within its --etcd-ttl)",
			ErrFleetRunning, bot, len(members), strings.Join(members, " "), shards)
	}
	return old, nil
}

// MinVersion is the oldest etcd a node joins (DESIGN 7.3): older servers
// lack fixes the fencing relies on (Debian 12 ships 3.4.23).
const MinVersion = "3.5.13"

// ErrEtcdTooOld: an etcd server answered with a version below MinVersion.
var ErrEtcdTooOld = errors.New("etcd too old")

// versionAtLeast reports whether the etcd version v ("3.5.13", perhaps
// with a "-suffix") is min or later; a version it cannot read is not.
func versionAtLeast(v, min string) bool {
	parse := func(s string) ([3]int, bool) {
		s, _, _ = strings.Cut(s, "-")
		s, _, _ = strings.Cut(s, "+")
		f := strings.Split(s, ".")
		var out [3]int
		if len(f) != 3 {
			return out, false
		}
		for i, x := range f {
			n, err := strconv.Atoi(x)
			if err != nil || n < 0 {
				return out, false
			}
			out[i] = n
		}
		return out, true
	}
	a, ok := parse(v)
	b, _ := parse(min)
	if !ok {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

// versionTimeout bounds the version question to one endpoint: a member
// that is down (the client waits for it to be ready) must not hold a join
// while the others answer.
const versionTimeout = 2 * time.Second

// checkVersion asks every endpoint of cli for its version, all at once,
// and refuses one below MinVersion. Endpoints that do not answer within
// versionTimeout are skipped, unless none answers.
func checkVersion(ctx context.Context, status func(ctx context.Context, endpoint string) (string, error), endpoints []string) error {
	type answer struct {
		ep, version string
		err         error
	}
	answers := make(chan answer, len(endpoints))
	for _, ep := range endpoints {
		go func() {
			sctx, cancel := context.WithTimeout(ctx, versionTimeout)
			defer cancel()
			v, err := status(sctx, ep)
			answers <- answer{ep, v, err}
		}()
	}
	var lastErr, tooOld error
	answered := 0
	for range endpoints {
		a := <-answers
		switch {
		case a.err != nil:
			lastErr = a.err
		case !versionAtLeast(a.version, MinVersion):
			tooOld = fmt.Errorf("%w: %s runs etcd %s; shardfs needs %s or later (doc/fleet.md says where to get it)", ErrEtcdTooOld, a.ep, a.version, MinVersion)
			answered++
		default:
			answered++
		}
	}
	if tooOld != nil {
		return tooOld
	}
	if answered == 0 && lastErr != nil {
		return fmt.Errorf("etcd: ask the version: %w", lastErr)
	}
	return nil
}
