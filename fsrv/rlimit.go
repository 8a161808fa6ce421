package fsrv

import (
	"log/slog"
	"syscall"
)

// FileMargin is how many file descriptors FitMaxConns keeps, beside the
// connections and the caller's count, for what a process holds anyway:
// its listeners, log and session files, etcd's and the metrics server's
// sockets, and the refused connections being told that the server is
// full (maxTelling).
const FileMargin = 64 + maxTelling

// FitMaxConns returns the connection cap maxConns (0: DefaultMaxConns),
// lowered when the connections, others more file descriptors (the
// caller's: a gateway socket a shard, a child's pipes) and FileMargin do
// not fit the process's open-file limit, the soft RLIMIT_NOFILE (which
// Go raises to the hard one at start). Past that limit accept fails
// with EMFILE on every listener, and the unix socket's reserved slots
// (counted inside the cap) are starved with the rest. A lowered cap is
// logged at Warn, saying why and how to raise the limit; call it once, at
// start.
func FitMaxConns(log *slog.Logger, maxConns, others int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return maxConns
	}
	fit, ok := fitConns(maxConns, others, lim.Cur)
	if !ok {
		log.Warn("9P connection cap lowered to fit the open-file limit: past it accept fails for every listener, the unix socket's included; raise the limit (ulimit -n, LimitNOFILE=) to serve more",
			"max_conns", fit, "asked", maxConnsOr(maxConns), "nofile", lim.Cur, "kept_for_other_files", others+FileMargin)
	}
	return fit
}

func maxConnsOr(n int) int {
	if n <= 0 {
		return DefaultMaxConns
	}
	return n
}

// fitConns is FitMaxConns with the limit nofile given; ok is false when
// it lowered the cap. The cap is never below 4, so that the unix socket
// keeps one slot however low the limit.
func fitConns(maxConns, others int, nofile uint64) (fit int, ok bool) {
	maxConns = maxConnsOr(maxConns)
	room := int64(min(nofile, 1<<40)) - int64(others) - FileMargin
	if int64(maxConns) <= room {
		return maxConns, true
	}
	return int(max(room, 4)), false
}
