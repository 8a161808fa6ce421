package core

import "errors"

// Sentinels that callers map to their own error kinds (shardfs turns them
// into errnos). Errors returned by this package wrap one of them.
var (
	// ErrUsage: a command, duration, plan or payload is malformed.
	ErrUsage = errors.New("invalid argument")
	// ErrUnknownShard: a shard ID is not in the plan.
	ErrUnknownShard = errors.New("unknown shard")
	// ErrBusy: the command does not apply to the shard's state now.
	ErrBusy = errors.New("busy")
	// ErrTooLarge: a payload exceeds the gateway's 4096-byte limit.
	ErrTooLarge = errors.New("payload too large")
	// ErrNoLease: lease commands need a lease backend.
	ErrNoLease = errors.New("no lease backend")
)
