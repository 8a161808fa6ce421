package soak

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// owners is the history of the shards/<id> keys as a watch from the test
// process saw them: who owned what, from when (the time the event arrived).
type owners struct {
	mu   sync.Mutex
	hist map[int][]ownerChange // by shard, oldest first
	// lost is set when the watch ended before its context: later changes
	// would go unseen.
	lost error
}

type ownerChange struct {
	at   time.Time
	node string // "" once deleted
}

// watchOwners records the shard keys under prefix until ctx ends. It
// returns once the current keys are read.
func watchOwners(ctx context.Context, cli *clientv3.Client, prefix string, wg *sync.WaitGroup) (*owners, error) {
	o := &owners{hist: map[int][]ownerChange{}}
	dir := prefix + "shards/"
	gctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	resp, err := cli.Get(gctx, dir, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, kv := range resp.Kvs {
		o.set(dir, string(kv.Key), string(kv.Value), now)
	}
	wch := cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for wr := range wch {
			if err := wr.Err(); err != nil {
				o.mu.Lock()
				o.lost = err
				o.mu.Unlock()
			}
			now := time.Now()
			for _, ev := range wr.Events {
				node := string(ev.Kv.Value)
				if ev.Type == clientv3.EventTypeDelete {
					node = ""
				}
				o.set(dir, string(ev.Kv.Key), node, now)
			}
		}
		if ctx.Err() == nil {
			o.mu.Lock()
			o.lost = errors.Join(o.lost, errors.New("the watch of the shard keys ended"))
			o.mu.Unlock()
		}
	}()
	return o, nil
}

// err reports a watch that ended early.
func (o *owners) err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lost
}

func (o *owners) set(dir, key, node string, at time.Time) {
	id, err := strconv.Atoi(strings.TrimPrefix(key, dir))
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hist[id] = append(o.hist[id], ownerChange{at: at, node: node})
}

// ownedBetween reports whether node owned shard at some moment of [from,
// to], as the watch saw it; shard -1 means any shard.
func (o *owners) ownedBetween(node string, shard int, from, to time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if shard < 0 {
		for _, h := range o.hist {
			if ownedIn(h, node, from, to) {
				return true
			}
		}
		return false
	}
	return ownedIn(o.hist[shard], node, from, to)
}

func ownedIn(h []ownerChange, node string, from, to time.Time) bool {
	// The change in force at from, and every change up to to.
	i := sort.Search(len(h), func(i int) bool { return h[i].at.After(from) })
	if i > 0 && h[i-1].node == node {
		return true
	}
	for ; i < len(h) && !h[i].at.After(to); i++ {
		if h[i].node == node {
			return true
		}
	}
	return false
}

// current returns the holder of each shard of [0, total) as the watch last
// saw it ("" for none).
func (o *owners) current(total int) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, total)
	for id, h := range o.hist {
		if id >= 0 && id < total && len(h) > 0 {
			out[id] = h[len(h)-1].node
		}
	}
	return out
}

// movesSince counts the acquisitions the watch saw after from of a shard
// key by a node other than the one that held it last: a key rewritten by
// its holder (a rejoin that keeps its keys) is no move, nor is a deletion.
func (o *owners) movesSince(from time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	moves := 0
	for _, h := range o.hist {
		last := ""
		for _, ch := range h {
			if ch.node == "" {
				continue
			}
			if ch.node != last && ch.at.After(from) {
				moves++
			}
			last = ch.node
		}
	}
	return moves
}
