package core_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
)

// faultyStore is an in-memory store that fails, panics or hangs (until its
// deadline) at random, and numbers every resumable snapshot it takes, so
// that a test can tell one saved copy from another of the same session.
type faultyStore struct {
	mu       sync.Mutex
	seed     uint64
	calls    map[int]int
	snaps    map[int]core.Snapshot
	versions map[int]int // shard: version of snaps[shard]
	next     int
	// lastLoad is the version each shard's last successful load returned.
	lastLoad map[int]int
}

// fault decides a call's fate from the seed, the shard and how many calls
// the shard made before: the core orders each shard's calls, so the fates
// do not depend on how the goroutines of different shards interleave.
func (s *faultyStore) fault(ctx context.Context, shard int) error {
	s.mu.Lock()
	s.calls[shard]++
	r := rand.New(rand.NewPCG(s.seed, uint64(shard)<<32|uint64(s.calls[shard]))).IntN(20)
	s.mu.Unlock()
	switch r {
	case 0, 1, 2:
		return errors.New("store failed")
	case 3:
		return coretest.Block(ctx)
	case 4:
		panic("store panicked")
	case 5:
		return errLate
	}
	return nil
}

// errLate asks the call to do its work and then hang past its deadline.
var errLate = errors.New("late")

func (s *faultyStore) Load(ctx context.Context, shard int) (core.Snapshot, bool, error) {
	if err := s.fault(ctx, shard); err != nil && err != errLate {
		return core.Snapshot{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, ok := s.snaps[shard]
	s.lastLoad[shard] = s.versions[shard]
	return snap, ok, nil
}

func (s *faultyStore) Save(ctx context.Context, shard int, snap core.Snapshot) error {
	err := s.fault(ctx, shard)
	if err != nil && err != errLate {
		return err
	}
	s.mu.Lock()
	s.snaps[shard] = snap
	if snap.Used() {
		s.versions[shard] = 0
	} else {
		s.next++
		s.versions[shard] = s.next
	}
	s.mu.Unlock()
	if err == errLate {
		return coretest.Block(ctx) // saved, but too late to say so
	}
	return nil
}

func (s *faultyStore) loadedVersion(shard int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastLoad[shard]
}

func (s *faultyStore) current(shard int) (core.Snapshot, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snaps[shard], s.versions[shard]
}

// TestPropertySnapshotResumedOnce runs a few processes in a row on one
// store that fails at random, each ending cleanly (Close) or in a crash
// (dropped), with random traffic, stops and starts in between, and checks
// at every connection that resumes: a snapshot loaded from the store is
// resumed at most once, by one process, and only once its mark-used Save
// succeeded; and no shard ever resumes a session the store still holds
// resumable.
func TestPropertySnapshotResumedOnce(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const shards = 3
		store := &faultyStore{
			seed: rapid.Uint64().Draw(rt, "seed"), calls: map[int]int{},
			snaps: map[int]core.Snapshot{}, versions: map[int]int{}, lastLoad: map[int]int{},
		}
		resumedVersions := map[int]bool{} // versions resumed from a loaded snapshot, by any process
		var elapsed time.Duration
		sessions := 0
		for gen := range rapid.IntRange(1, 4).Draw(rt, "processes") {
			clk := clock.NewFake()
			clk.Advance(elapsed)
			tr := &coretest.Transport{}
			own := map[string]bool{}     // sessions this process got a READY for
			restored := map[int]string{} // the session each shard resumed from its snapshot
			var violations []string      // found while the core holds a shard
			tr.Probe = func(a core.Attempt) {
				if !a.Resume {
					return
				}
				snap, version := store.current(a.Shard)
				if !snap.Used() && snap.Session.ID == a.Session.ID {
					violations = append(violations, fmt.Sprintf("process %d shard %d resumes %s while the store holds it resumable (version %d)", gen, a.Shard, a.Session.ID, version))
				}
				if own[a.Session.ID] || restored[a.Shard] == a.Session.ID {
					return // this process's own session, or its restored one again
				}
				v := store.loadedVersion(a.Shard)
				switch {
				case v == 0:
					violations = append(violations, fmt.Sprintf("process %d shard %d resumes %s, which no load returned", gen, a.Shard, a.Session.ID))
				case resumedVersions[v]:
					violations = append(violations, fmt.Sprintf("process %d shard %d resumes snapshot version %d a second time", gen, a.Shard, v))
				}
				resumedVersions[v] = true
				restored[a.Shard] = a.Session.ID
			}
			node, err := core.New(core.Config{
				Plan: core.Range(shards, 0, shards-1), Transport: tr, Clock: clk,
				Pacer: core.NewDiscordPacer(clk, shards), Backoff: core.Fixed(time.Second),
				Rand: func() float64 { return 0.5 }, Sessions: store, StoreTimeout: 2 * time.Millisecond,
			})
			if err != nil {
				rt.Fatal(err)
			}
			node.Start()
			for range rapid.IntRange(0, 25).Draw(rt, "steps") {
				id := rapid.IntRange(0, shards-1).Draw(rt, "shard")
				c := tr.Last(id)
				switch rapid.SampledFrom([]string{"ready", "resumed", "fail", "new-session", "stop", "start", "advance"}).Draw(rt, "action") {
				case "ready":
					if c != nil {
						sessions++
						sid := fmt.Sprintf("session-%d", sessions)
						own[sid] = true
						c.Link.Ready(core.Session{ID: sid}, int64(sessions))
					}
				case "resumed":
					if c != nil {
						c.Link.Resumed(0)
					}
				case "fail":
					if c != nil {
						c.Link.Fail(core.Failure{Class: core.Transient, Err: errDrop})
					}
				case "new-session":
					if c != nil {
						c.Link.Fail(core.Failure{Class: core.NewSession, Err: errDrop, Code: 4009})
					}
				case "stop":
					node.ExecShard(id, "stop")
				case "start":
					node.ExecShard(id, "start")
				case "advance":
					clk.Advance(time.Duration(rapid.IntRange(0, 90_000).Draw(rt, "ms")) * time.Millisecond)
				}
				if len(violations) > 0 {
					rt.Fatal(violations[0])
				}
			}
			if rapid.Bool().Draw(rt, "clean") {
				node.Close()
			} // else a crash: the process is gone, its node dropped
			elapsed = clk.Now().Sub(clock.Epoch) + time.Duration(rapid.IntRange(0, 60_000).Draw(rt, "down ms"))*time.Millisecond
		}
	})
}
