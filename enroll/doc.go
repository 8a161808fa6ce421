// Package enroll gives a PXE-booted node its secrets over mutual TLS once
// an operator approves the node's key, or the node shows a one-time code
// (DESIGN 7.6).
//
// The node (Client) makes an ECDSA P-256 key pair in memory at every
// boot, prints its Fingerprint, and connects to the enrollment server
// (Server, `shardfs netboot --serve`) over TLS: it checks the server's
// certificate against the enrollment CA its image carries, and presents a
// self-signed certificate of its own key, whose fingerprint is who it is.
// It sends one Request (a JSON line) holding a certificate signing request
// for that key; the server answers "pending" at once and then, when the
// operator writes `approve FINGERPRINT` to /enroll/ctl on the server's
// tree, or when the request carries a one-time code given for the node's
// MAC or name, one Reply with the token, etcd's credentials, the CA of the
// clients the node's listener accepts, and the listener's certificate,
// signed by the server's node CA for the node's key. The node's private
// key never leaves it. Nothing else ever carries these secrets: the boot
// image holds only the enrollment CA's certificate and the server's
// address.
//
// Decisions:
//   - A fingerprint is "sha256:" and the hex SHA-256 of the key's
//     SubjectPublicKeyInfo, the whole of it: the operator compares it
//     with the node's console and pastes it; no prefix matches.
//   - A key is served once. After delivery its fingerprint is enrolled,
//     and any later request from it is refused: the key lives only in the
//     node's memory for one boot, so a second request for it is either a
//     thief or a node that lost the reply, and a rebooted node has a new
//     key anyway. An approval whose node went away before delivery stays
//     until the node asks again (with the same key), or the server ends.
//   - `deny FINGERPRINT` refuses the waiting request and every later one
//     from that key.
//   - One-time codes (`netboot --serve --enroll-code FILE`): each is bound
//     to one MAC or node name, used once (the first match spends it,
//     whatever happens next), and expires (default 1 h). A code is never
//     logged nor shown in the tree. The node takes its code from its
//     console (an operator types it there): the kernel command line and
//     everything the boot server hands out are readable by anyone on the
//     boot network, so a code carried there would give the node's secrets
//     to whoever reads the network first. A request with a wrong, spent or
//     expired code is refused at once; the node then waits for approval.
//   - Bounds: MaxPending requests wait at once (default 64), and
//     MaxPendingPerAddr from one address (default 4); beyond either a
//     request is refused at once with "busy". A connection has
//     HandshakeTimeout for its TLS handshake and its request (10 s); a
//     request is at most 64 KiB; pending requests wait at most MaxWait
//     (default 10 min). One address may have MaxPerAddr connections in
//     their handshake at once (default 8), all addresses MaxPending+16;
//     a connection beyond either is closed at once. Each bound per
//     address has a second one per prefix, half of the total: an IPv6
//     /64, or all of loopback; an IPv4 address is its own prefix, since a
//     boot network's /24 holds the nodes that enroll. Waiting requests do
//     not hold handshake slots, so a flood of handshakes does not stop a
//     request that got through. The accept loop never waits on a request.
//   - Refusals are logged (and put into /enroll/events) at most
//     refusal.Burst a minute per kind of refusal and refusal.NodeBurst
//     in all, the window growing while a flood lasts, with one summary
//     line per window (package refusal): a flood cannot push the pending,
//     approved and enrolled lines out of /enroll/events.
//   - The server names the node: the listener's certificate is issued for
//     the name Config.NodeNames gives the node's MAC (netboot --serve
//     --node-names), else the name a spent code was given for, else pxe-
//     and the MAC (the name a node takes by default), with that name and
//     the address the request came from as its only subject alternative
//     names. The name and addresses the request carries are the node's
//     own claim, which anyone on the boot network can make: /enroll/pending
//     shows the requested name beside the one that will be issued, and
//     nothing else uses them. A request whose MAC is not a MAC, or whose
//     name is not 1 to 63 of a-z, 0-9, '-' and '.' (upper case is taken
//     as lower), is refused: no wildcard, no escape sequence for the
//     operator's terminal. Its validity is the node CA's default for
//     servers (a year).
package enroll
