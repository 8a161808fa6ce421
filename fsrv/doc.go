// Package fsrv serves a tree of synthetic files (directories, text files,
// ctl files and log files) over 9P2000.L and 9P2000 on one listener.
//
// # The tree
//
// A tree is built from four kinds of File: a *Dir lists its entries through
// a callback at walk and listing time, so entries come and go; a *Text
// computes its content at open and keeps it for that open; a *Ctl applies
// the lines written to it, one command each, a line ending at its newline
// or with its write unless that write is a client's cut of a longer one,
// and reports the bytes applied when a line fails after others (see Ctl);
// a *LogFile reads an append-only LogSource by absolute offset. Permissions do not depend on
// the user: directories are r-x, Text and LogFile files r, Ctl files rw (or w
// without a Usage). Clients cannot create, remove or rename anything.
//
// # Dialects
//
// A connection's first message must be a Tversion, read with a size bound
// (512 bytes) and a deadline (Server.VersionTimeout). A version that starts
// with 9P2000.L is served by github.com/hugelgupf/p9; 9P2000, 9P2000.u and
// other 9P2000.x versions by 9fans.net/go/plan9/srv9p, which answers them
// as 9P2000; any other version is answered "unknown" and the client may
// propose another. A first message that is not a well-formed Tversion is
// answered with Rerror and the connection dropped; a frame whose size is
// out of bounds is dropped without a reply; an msize below MinMsize is
// answered with an error (Rlerror EINVAL for .L) and dropped. Under
// 9P2000.L a Tauth is answered ENOENT, which diod's tools take to mean that
// no authentication is needed; a Txattrcreate EOPNOTSUPP (p9 would keep
// the attribute's value in memory up to a size the client names); a Tread
// or Treaddir count past msize is cut to what one reply holds; a Twrite whose count disagrees with its size
// is answered EINVAL on its tag, and any other request that cannot be
// decoded ends the connection (hugelgupf/p9 would answer it on NOTAG,
// leaving the client waiting for its own tag); a request of a type p9 does
// not decode is answered ENOSYS, Tgetlock F_UNLCK, and a Tattach or Twalk
// onto a fid in use EBADF. Under 9P2000 a request of an unknown type
// (plan9port's Topenfd) or whose fields do not fill its frame is answered
// Rerror, and ".." at the root of an attach stays there. In both dialects
// a Tversion inside a session clunks every fid and aborts the requests in
// flight, whose replies are not sent (version(5)), and a Tattach's
// aname names the directory to attach at ("/3", or "3"), and Rattach
// carries its QID; an aname that names a file is refused with ENOTDIR ("not
// a directory: ..."), since diod's tools attach to "ctl" by default and
// diodls crashes on a file. Reads never block: hugelgupf/p9 cannot cancel a
// read on Tflush, and Linux waits for Rflush even through SIGKILL.
//
// # Errors
//
// Callbacks return errors that wrap fs.ErrInvalid, fs.ErrPermission,
// fs.ErrNotExist, ErrBusy or ErrTooLarge. One place converts them: to
// EINVAL, EACCES, ENOENT, EBUSY, EFBIG under 9P2000.L (any other error is
// EIO), and under 9P2000 to strings that plan9port's 9pfuse maps back to
// the same errno: "invalid argument: <detail>", "permission denied:
// <detail>", "file not found: <detail>", "busy: <detail>", "invalid
// argument: write too large: <detail>" and "i/o error: <detail>". An error
// without detail is sent as a string the Linux kernel's 9P2000 client also
// knows ("Invalid argument", "permission denied", "file not found", "Device
// or resource busy", "i/o error"). A 9P2000 error string is clipped, ending
// in "...", so that it fits ERRMAX (127 bytes and a NUL), where plan9port
// and Plan 9 cut, and its Rerror the negotiated msize (srv9p drops a
// larger reply, and the client would wait forever).
//
// # Bounds
//
// One client cannot hurt the others. A connection may have MaxRequests (64)
// requests in flight: past that the server stops reading it until replies
// drain, so a flood of Treads the client never collects holds 64 reads'
// buffers (measured: 20,000 Treads of 262,000 bytes, heap +17 MB; before,
// 1,000 of them took +263 MB). The connections of Serve's TCP and TLS
// listeners share MaxInFlightBytes (64 MiB) of requests in flight past
// the first of each, counted at msize a request, so that many such
// clients together hold no more. It may hold MaxFids (4,096) fids: a request
// that would make one more is refused with EMFILE ("too many open files:
// ...") and the connection stays usable. Both are counted from the requests
// read and the replies written, whichever engine serves the connection, so
// a tag reused while its request is in flight ends the connection: its
// replies could no longer be counted. Serve admits a connection only
// within its budgets (budget.go): Server.MaxConns over all listeners
// (DefaultMaxConns, 4,096) less the slots kept for unix sockets
// (UnixReserve), each listener's own cap (",max=N"), and for each TCP or
// TLS listener its connections still in their handshake, in all
// (MaxHandshakes), from one address (MaxHandshakesPerAddr) and from one
// prefix (MaxHandshakesPerPrefix: another host's /24 or /64; a process of
// this host is counted by its uid, which the kernel tells, whatever
// loopback address it binds). A refused connection is told
// that the server is full (ENFILE, "server full: ...", or a TLS
// user_canceled alert) and closed; refusals are logged at most once a
// minute. The wait for Tversion is bounded (VersionTimeout), and so is
// the time from the first byte of any message to its last
// (MessageTimeout, 30 s) in both directions: a connection that sends half
// a message and stalls, or leaves a reply untaken that long, is closed.
// A TCP or TLS connection with no request for IdleTimeout (10 min) is
// closed; a unix socket's may idle for ever. A 9P2000 Tversion inside a
// session is held to MinMsize like the first.
//
// # Listening
//
// Listen takes tcp!host!port, host:port, unix!path or a path (see
// ParseAddr), then options after commas (see ParseListenAddr). ",ro" makes
// a read-only listener: its connections may open nothing for writing,
// truncate, write, create, remove or change attributes (EACCES, "permission
// denied: ..."), files show no write bits, and nodes marked Private are
// absent from listings, walks and attaches. A write refused because the
// listener is read-only is logged at Warn ("fsrv: write refused on a
// read-only listener", with the remote address, the client certificate's
// name, the file and why: the listener's ",ro" or its rules file naming
// the certificate ro, which the 9P2000 error says too), at most once a minute for the whole server; the next
// line counts those left out (more_refused). The refusal changes nothing
// shared, so the other connections are not slowed or affected. Plain TCP
// on an address that is
// not loopback is refused unless ",insecure" says otherwise; the error
// names tls!HOST!PORT. An unknown option is an error. Server.Serve serves a
// listener, Server.ServeConn one connection (read-write); Close or the
// context ends both.
//
// # TLS
//
// ListenTLS serves tls!HOST!PORT (any address, ",ro" as above): 9P over
// TLS 1.3 only, with a client certificate required and verified against
// the configuration's ClientCAs (ServerTLSConfig loads one from PEM
// files). Open gives each tls! listener its own client CA (",ca=FILE"),
// rules file (",clients=FILE", see Rules: who may connect, read-only or
// read-write) and the deny list (TLSFiles.Deny, see DenyList), and
// Listeners.Reload reads them all again for new handshakes and closes the
// connections whose certificate they no longer serve as before; the common
// name, serial and role are logged at Info for every connection, and
// every accepted Ctl write is audited (AuditRecord). The handshake runs in
// the connection's goroutine within Server.HandshakeTimeout (10 s), so a
// client that stalls it holds one of its listener's MaxHandshakes and a
// goroutine for that long and nothing else. Before the handshake the server looks at the
// first five bytes itself: crypto/tls takes a 21-byte 9P Tversion
// ("9P2000.L") for an alert record and would wait for 100 bytes more, so a
// plain 9P client would hang until the timeout instead of being told. Each
// refusal is logged at Warn with a fixed reason (no client certificate,
// client certificate signed by another CA, expired, not yet valid, not
// for client authentication, plain 9P on the TLS port, not a TLS client,
// handshake timed out, the client refused the server's certificate) and
// a detail naming the certificate; a reason is logged at most once a
// minute (Server.Clock), the next line counting the refusals skipped
// (more_refused). Dial is the client side: for tls! it verifies the
// server's certificate against the given CA and the host dialled, and
// ExplainTLS turns crypto/tls errors and the server's alerts into what
// failed (server name, CA, expiry, our certificate refused, the server
// full).
package fsrv
