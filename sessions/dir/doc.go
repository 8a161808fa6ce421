// Package dir is the folder session store behind "serve --sessions DIR": one
// file per shard, DIR/shard-ID.json, replaced atomically.
//
// The decisions:
//
//   - The folder is created 0700. One that another user owns, or that group
//     or others may write, is refused: someone else may already have put or
//     swapped files in it, and tightening it would not undo that. One that
//     others may only read or enter is tightened to 0700 with a warning; the
//     owner's bits are left alone (a 0500 folder loads and fails to save).
//     The path may lead through symlinks: the operator named it. Every file
//     inside is then reached through the folder opened once, so a folder
//     swapped later is not followed.
//   - DIR/lock is locked with flock for the Store's life and holds the
//     holder's PID; a second Open, in any process, is refused and names that
//     PID. The lock file is never removed (a removed one lets two processes
//     lock two files of one name); the kernel releases the lock when the
//     process dies, so a crash leaves no stale lock, only a stale PID that
//     the next holder overwrites.
//   - A save writes a temp file in the folder (O_EXCL, mode 0600), syncs it,
//     renames it over shard-ID.json and syncs the folder. Open removes the
//     temp files a crash left; it holds the lock, so none is in use.
//   - A snapshot file is refused when it is a symlink (never followed), not a
//     regular file, owned by another user, or larger than sessions.MaxSize.
//     One that others may read is used (the 0700 folder kept them out),
//     tightened to 0600 and warned about once.
//   - File I/O cannot be interrupted, so Load and Save run it in a goroutine
//     and return when ctx ends. An abandoned save stops before its rename if
//     it has not reached it; saves of one shard run one at a time, so it
//     never lands after a later one. Close waits for abandoned I/O before it
//     releases the lock.
package dir
