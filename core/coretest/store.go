package coretest

import (
	"context"
	"sync"

	"github.com/shardfs/shardfs/core"
)

// Store is an in-memory core.SessionStore that records every call. Its
// hooks, when set, run before each call and may block (honouring ctx or
// not), fail or panic.
type Store struct {
	// OnLoad and OnSave, when set, run first; a non-nil error is
	// returned and the call does nothing else.
	OnLoad func(ctx context.Context, shard int) error
	OnSave func(ctx context.Context, shard int, snap core.Snapshot) error

	mu    sync.Mutex
	snaps map[int]core.Snapshot
	calls []StoreCall
}

var _ core.SessionStore = (*Store)(nil)

// StoreCall is one call the core made.
type StoreCall struct {
	Op    string // "load" or "save"
	Shard int
	Snap  core.Snapshot // what a save stored
	Err   error
}

// Put stores snap for shard, as a previous process would have.
func (s *Store) Put(shard int, snap core.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snaps == nil {
		s.snaps = map[int]core.Snapshot{}
	}
	s.snaps[shard] = snap
}

// Get returns what the store holds for shard.
func (s *Store) Get(shard int) (core.Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.snaps[shard]
	return snap, ok
}

// Calls returns the calls so far, in the order they returned.
func (s *Store) Calls() []StoreCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StoreCall(nil), s.calls...)
}

// Load implements core.SessionStore.
func (s *Store) Load(ctx context.Context, shard int) (core.Snapshot, bool, error) {
	if s.OnLoad != nil {
		if err := s.OnLoad(ctx, shard); err != nil {
			s.record(StoreCall{Op: "load", Shard: shard, Err: err})
			return core.Snapshot{}, false, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.snaps[shard]
	s.calls = append(s.calls, StoreCall{Op: "load", Shard: shard, Snap: snap})
	return snap, ok, nil
}

// Save implements core.SessionStore.
func (s *Store) Save(ctx context.Context, shard int, snap core.Snapshot) error {
	if s.OnSave != nil {
		if err := s.OnSave(ctx, shard, snap); err != nil {
			s.record(StoreCall{Op: "save", Shard: shard, Snap: snap, Err: err})
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snaps == nil {
		s.snaps = map[int]core.Snapshot{}
	}
	s.snaps[shard] = snap
	s.calls = append(s.calls, StoreCall{Op: "save", Shard: shard, Snap: snap})
	return nil
}

func (s *Store) record(c StoreCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// Block is a hook body that blocks until ctx ends: a store that hangs but
// honours its deadline.
func Block(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
