package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/sessions"
)

// ErrNotOwned is wrapped by a Save for a shard this node holds no
// generation of.
var ErrNotOwned = errors.New("shard not owned by this node")

// Guard commits writes about a shard only while the shard's key still has
// the given generation, and fails (wrapping lease/etcd's ErrGeneration)
// without writing when it has not. *etcd.Member of package lease/etcd is
// one; a node that joins again after a lost membership gives the Store a
// Guard that forwards to its current Member.
type Guard interface {
	// Prefix is the folder of the bot's keys, ending in '/'.
	Prefix() string
	Guarded(ctx context.Context, shard int, gen int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Config describes a Store. Every field is required.
type Config struct {
	// KV serves Load's reads: the client the Member joined with.
	KV clientv3.KV
	// Guard commits every Save.
	Guard Guard
	// Generation returns the generation this node holds for shard, as
	// Acquire returned it; ok is false when it holds none (never
	// acquired, released, or lost). The ownership layer provides it.
	Generation func(shard int) (gen int64, ok bool)
}

// Store keeps one bot's snapshots under <prefix>sessions/<id>. It holds no
// state of its own, so calls for different shards run concurrently.
type Store struct {
	kv     clientv3.KV
	guard  Guard
	gen    func(int) (int64, bool)
	prefix string
}

var _ core.SessionStore = (*Store)(nil)

// New returns the store of cfg.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.KV == nil:
		return nil, errors.New("sessions/etcd: no KV")
	case cfg.Guard == nil:
		return nil, errors.New("sessions/etcd: no Guard")
	case cfg.Generation == nil:
		return nil, errors.New("sessions/etcd: no Generation")
	}
	p := cfg.Guard.Prefix()
	if !strings.HasSuffix(p, "/") {
		return nil, fmt.Errorf("sessions/etcd: prefix %q does not end in '/'", p)
	}
	return &Store{kv: cfg.KV, guard: cfg.Guard, gen: cfg.Generation, prefix: p}, nil
}

// Key returns the key of shard's snapshot.
func (s *Store) Key(shard int) string { return s.prefix + "sessions/" + strconv.Itoa(shard) }

// Load implements core.SessionStore. The read is linearizable, so a new
// owner sees the snapshot the old one wrote before it released the shard.
func (s *Store) Load(ctx context.Context, shard int) (core.Snapshot, bool, error) {
	if shard < 0 {
		return core.Snapshot{}, false, fmt.Errorf("sessions/etcd: load shard %d: negative shard id", shard)
	}
	r, err := s.kv.Get(ctx, s.Key(shard))
	if err != nil {
		return core.Snapshot{}, false, fmt.Errorf("sessions/etcd: load shard %d: %w", shard, err)
	}
	if len(r.Kvs) == 0 {
		return core.Snapshot{}, false, nil
	}
	snap, err := sessions.Decode(r.Kvs[0].Value)
	if err != nil {
		// Decode's errors show nothing read from the value.
		return core.Snapshot{}, false, fmt.Errorf("sessions/etcd: load shard %d: %s: %w", shard, s.Key(shard), err)
	}
	return snap, true, nil
}

// Save implements core.SessionStore: one transaction that puts the
// snapshot only while the shard's key has the generation this node holds.
// A Save with an empty Session.ID is the mark-used.
func (s *Store) Save(ctx context.Context, shard int, snap core.Snapshot) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sessions/etcd: save shard %d: %w", shard, err)
	}
	b, err := sessions.Encode(snap)
	if err != nil {
		// Encode's errors never show the session id.
		return fmt.Errorf("sessions/etcd: save shard %d: %w", shard, err)
	}
	gen, ok := s.gen(shard)
	if !ok {
		return fmt.Errorf("sessions/etcd: save shard %d: %w; nothing written", shard, ErrNotOwned)
	}
	// Guarded names the shard, this node's generation and the key's
	// current one, and never the ops (the value holds the session id).
	if _, err := s.guard.Guarded(ctx, shard, gen, clientv3.OpPut(s.Key(shard), string(b))); err != nil {
		return fmt.Errorf("sessions/etcd: save shard %d: %w", shard, err)
	}
	return nil
}
