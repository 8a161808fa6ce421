package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ShardKey returns the key of shard id.
func (m *Member) ShardKey(id int) string { return m.prefix + "shards/" + strconv.Itoa(id) }

func (m *Member) checkShard(id int) error {
	if id < 0 || id >= m.plan.Total {
		return fmt.Errorf("%w: shard %d, plan %s", ErrUnknownShard, id, m.plan)
	}
	return nil
}

func (m *Member) checkLive() error {
	if err := m.Err(); err != nil {
		return fmt.Errorf("node %s: %w", m.node, err)
	}
	return nil
}

// Acquire creates shards/<id> for this node, attached to its lease, if no
// one holds it, and returns the generation: the key's CreateRevision, which
// grows with every new owner. A key this membership already holds returns
// its generation; one held by anyone else fails with ErrShardTaken.
func (m *Member) Acquire(ctx context.Context, id int) (int64, error) {
	if err := m.checkShard(id); err != nil {
		return 0, err
	}
	if err := m.checkLive(); err != nil {
		return 0, fmt.Errorf("etcd: acquire shard %d: %w", id, err)
	}
	key := m.ShardKey(id)
	r, err := m.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.node, clientv3.WithLease(m.id))).
		Else(clientv3.OpGet(key)).Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// etcd expired the lease before the local deadline came: the
		// membership is over now, whatever the local clock says.
		m.mu.Lock()
		m.loseLocked(fmt.Errorf("%w: etcd no longer knows lease %x (it expired there)", ErrLeaseLost, int64(m.id)))
		err = m.err
		m.mu.Unlock()
	}
	if err != nil {
		return 0, fmt.Errorf("etcd: acquire shard %d: %w", id, err)
	}
	if r.Succeeded {
		// The key was created by this transaction, so its CreateRevision
		// is the transaction's revision.
		return r.Header.Revision, nil
	}
	kvs := r.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) != 1 {
		return 0, fmt.Errorf("%w: shard %d: key vanished while read", ErrShardTaken, id)
	}
	kv := kvs[0]
	if clientv3.LeaseID(kv.Lease) == m.id && string(kv.Value) == m.node {
		return kv.CreateRevision, nil
	}
	return 0, fmt.Errorf("%w: shard %d is held by node %s (generation %d, lease %x)", ErrShardTaken, id, quote(kv.Value), kv.CreateRevision, kv.Lease)
}

// Release deletes shards/<id> if its generation is still gen.
func (m *Member) Release(ctx context.Context, id int, gen int64) error {
	_, err := m.Guarded(ctx, id, gen, clientv3.OpDelete(m.ShardKey(id)))
	return err
}

// Guarded commits ops in one transaction that succeeds only while
// shards/<id> exists with CreateRevision gen: every etcd write about a
// shard goes through it, so an owner that lost the shard (its key expired
// and was re-created by another node) cannot write over the new owner's
// state. It fails with ErrGeneration when the guard does not hold, and
// with ErrLeaseLost once the membership ended.
func (m *Member) Guarded(ctx context.Context, id int, gen int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := m.checkShard(id); err != nil {
		return nil, err
	}
	if gen <= 0 {
		// CreateRevision == 0 would hold for an absent key.
		return nil, fmt.Errorf("%w: shard %d: generation %d is not one etcd gives", ErrGeneration, id, gen)
	}
	if err := m.checkLive(); err != nil {
		return nil, fmt.Errorf("etcd: guarded write of shard %d: %w", id, err)
	}
	key := m.ShardKey(id)
	r, err := m.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", gen)).
		Then(ops...).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd: guarded write of shard %d (generation %d): %w", id, gen, err)
	}
	if !r.Succeeded {
		now := "absent"
		if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			now = fmt.Sprintf("generation %d, node %s", kvs[0].CreateRevision, quote(kvs[0].Value))
		}
		return r, fmt.Errorf("%w: shard %d: have generation %d, key is %s; nothing written", ErrGeneration, id, gen, now)
	}
	return r, nil
}

// Holder is the owner of one shard key as etcd shows it.
type Holder struct {
	Shard      int
	Node       string
	Generation int64
	// Live reports whether Node is a live member. A key naming an unknown
	// node is reported, not trusted: it blocks the shard until it expires
	// or an operator deletes it.
	Live  bool
	lease clientv3.LeaseID
}

// Owners lists the shard keys of the plan, ascending by shard, read at one
// revision with the members. Keys that are not shards of the plan are
// skipped, each with one log line.
func (m *Member) Owners(ctx context.Context) ([]Holder, error) {
	members, shards, err := m.read(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd: list owners: %w", err)
	}
	return m.holders(names(members), shards), nil
}

// holders turns the shard keys read with members into Holders.
func (m *Member) holders(members []string, shards []*mvccpb.KeyValue) []Holder {
	var out []Holder
	for _, kv := range shards {
		key := string(kv.Key)
		id, ok := parseShard(strings.TrimPrefix(key, m.prefix+"shards/"), m.plan.Total)
		if !ok {
			m.logOnce(kv, "etcd: ignoring a key that is not a shard of the plan", "plan", m.plan.String())
			continue
		}
		node := string(kv.Value)
		if checkName("node", node) != nil {
			m.logOnce(kv, "etcd: ignoring a shard key whose value is not a node name", "value", clip(kv.Value))
			continue
		}
		h := Holder{Shard: id, Node: node, Generation: kv.CreateRevision, Live: slices.Contains(members, node), lease: clientv3.LeaseID(kv.Lease)}
		if !h.Live && node != m.node {
			// This node's own keys outlive its member key during a
			// drain (Leave comes first): expected, not worth a line each.
			m.logOnce(kv, "etcd: shard key names a node that is not a live member; not trusted", "node", node)
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Holder) int { return a.Shard - b.Shard })
	return out
}

// Members lists the live members of the bot, sorted. A key under members/
// that is not a member of this bot (a nested name, a key without a lease,
// a value naming another node) is skipped with one log line.
func (m *Member) Members(ctx context.Context) ([]string, error) {
	members, _, err := m.read(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd: list members: %w", err)
	}
	return names(members), nil
}

// read returns the live members with their candidates, sorted by name,
// and the shard keys, read at one revision.
func (m *Member) read(ctx context.Context) ([]Candidate, []*mvccpb.KeyValue, error) {
	mp, sp := m.prefix+"members/", m.prefix+"shards/"
	r, err := m.kv.Txn(ctx).Then(
		clientv3.OpGet(mp, clientv3.WithPrefix()),
		clientv3.OpGet(sp, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, nil, err
	}
	var members []Candidate
	for _, kv := range r.Responses[0].GetResponseRange().GetKvs() {
		name := strings.TrimPrefix(string(kv.Key), mp)
		if checkName("node", name) != nil {
			m.logOnce(kv, "etcd: ignoring a key under members/ that is not a member of this bot")
			continue
		}
		if kv.Lease == 0 {
			m.logOnce(kv, "etcd: ignoring a member key without a lease (it would never expire)")
			continue
		}
		c, ok := decodeMember(name, kv.Value, m.plan.Total)
		if !ok {
			m.logOnce(kv, "etcd: ignoring a member key whose value names another node or bad shards", "value", clip(kv.Value))
			continue
		}
		members = append(members, c)
	}
	slices.SortFunc(members, func(a, b Candidate) int { return strings.Compare(a.Node, b.Node) })
	return members, r.Responses[1].GetResponseRange().GetKvs(), nil
}

// names returns the nodes of members.
func names(members []Candidate) []string {
	out := make([]string, len(members))
	for i, c := range members {
		out[i] = c.Node
	}
	return out
}

// logOnce logs a line about a malformed key once per version of it, so a
// tree read every second does not repeat it.
func (m *Member) logOnce(kv *mvccpb.KeyValue, msg string, args ...any) {
	m.mu.Lock()
	key := string(kv.Key)
	if m.logged[key] == kv.ModRevision {
		m.mu.Unlock()
		return
	}
	if len(m.logged) >= 4096 {
		clear(m.logged)
	}
	m.logged[key] = kv.ModRevision
	m.mu.Unlock()
	m.log.Warn(msg, append([]any{"bot", m.bot, "key", key}, args...)...)
}
