package fsrv

import "log/slog"

// OpenOptional opens each of addrs beside ls's listeners (no tls! ones:
// they take files), and logs and leaves out each one that cannot be
// opened. serve's default loopback TCP listener is opened so: any local
// user may bind tcp!127.0.0.1!5640 before the node starts, and that must
// not stop a node whose operator reaches it on its unix socket anyway.
// Addresses the operator named with --listen go through Open, where a
// failure is fatal.
func (ls *Listeners) OpenOptional(addrs []string, log *slog.Logger) {
	for _, a := range addrs {
		o, err := Open([]string{a}, TLSFiles{})
		if err != nil {
			log.Warn("a default listener is not served: it cannot be opened (another local user may hold its port); the unix socket serves the tree, and clients refuse a loopback port another user serves", "addr", a, "err", err)
			continue
		}
		ls.List = append(ls.List, o.List...)
	}
}
