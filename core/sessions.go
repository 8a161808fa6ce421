package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// SessionKey is the name a dispatch line gives its session: the first 12
// hex digits (48 bits) of SHA-256 over a fixed label and the session id.
// (shard, session key, s) names one event across nodes and restarts, so a
// reader that gets a copy (a node that delivered after losing its shard,
// a replay) can drop it. It depends on the id alone, so every node and
// every restart computes the same key for one session; the id is 128
// random bits, so the key does not reveal it, and 48 bits keep two
// sessions of one shard apart. An empty id (no session yet) has the
// empty key.
func SessionKey(id string) string {
	if id == "" {
		return ""
	}
	h := sha256.Sum256([]byte("shardfs session key\x00" + id))
	return hex.EncodeToString(h[:6])
}

// Snapshot is what a shard needs to resume its session after the process
// that held it stopped cleanly (DESIGN.md section 7.1). Session.ID is a
// secret: a snapshot with it lets the token resume the session.
type Snapshot struct {
	Flavor   Flavor
	Session  Session // ID empty: used (or never resumable)
	Sequence int64
	Total    int
	SavedAt  time.Time
}

// Used reports whether the snapshot holds nothing resumable.
func (s Snapshot) Used() bool { return !s.Session.exists() }

// SessionStore keeps one snapshot per shard across restarts of the process
// (a folder of files, etcd). The core bounds every call with ctx and treats
// an error or a timeout as "nothing to resume": a store problem never stops
// a shard. Both methods may be called concurrently for different shards.
type SessionStore interface {
	// Load returns shard's stored snapshot; ok is false when there is
	// none. A snapshot that cannot be decoded is an error.
	Load(ctx context.Context, shard int) (snap Snapshot, ok bool, err error)
	// Save replaces shard's snapshot. Saving one whose Session.ID is
	// empty marks the stored copy used. An error means nothing was
	// replaced; a Save that outlives ctx may have replaced it.
	Save(ctx context.Context, shard int, snap Snapshot) error
}
