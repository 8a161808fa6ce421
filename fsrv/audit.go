package fsrv

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// AuditRecord is one command line a Ctl file (a node's ctl, a shard's
// ctl or send) accepted: who wrote it, through which listener. It
// carries the command word (or a send's op), never the rest of the line.
type AuditRecord struct {
	// Listener is the address of the listener the connection came
	// through, in the tree's syntax (tls!HOST!PORT, unix!PATH), or "-"
	// for a connection ServeConn was given.
	Listener string
	// Peer is the connection's remote address ("-" when it has none).
	Peer string
	// Who is the client: `cn=NAME serial=HEX` for a TLS client
	// certificate, `uid=N pid=N` for a unix socket's peer (SO_PEERCRED),
	// `uid=N` for a TCP client of this host (the owner of its socket),
	// "-" otherwise.
	Who string
	// File is the Ctl's Path (its Name without one); Bytes the length
	// of the line, without its newline.
	File  string
	Bytes int
	// Command is the line's first word when it is a plain word (a ctl
	// command: stop, reset, lease), "opN" for a JSON object with an
	// integer "op" (a gateway command written to send), else empty.
	Command string
}

// String is the record as logfmt fields, the form of the log and of a
// node's /events line.
func (r AuditRecord) String() string {
	s := fmt.Sprintf("listener=%s peer=%s who=%q file=%s bytes=%d", r.Listener, r.Peer, r.Who, r.File, r.Bytes)
	if r.Command != "" {
		s += " cmd=" + r.Command
	}
	return s
}

// identity names the client of rwc for AuditRecord.Who.
func identity(rwc any) string {
	switch c := rwc.(type) {
	case *tls.Conn:
		if st := c.ConnectionState(); len(st.PeerCertificates) > 0 {
			p := st.PeerCertificates[0]
			return "cn=" + p.Subject.CommonName + " serial=" + Serial(p)
		}
	case *net.UnixConn:
		if cred, err := PeerCred(c); err == nil {
			return "uid=" + strconv.Itoa(int(cred.Uid)) + " pid=" + strconv.Itoa(int(cred.Pid))
		}
	case *net.TCPConn:
		// A client of this host: the owner of its socket (no pid: the
		// kernel keeps none for a TCP socket).
		la, lok := c.LocalAddr().(*net.TCPAddr)
		ra, rok := c.RemoteAddr().(*net.TCPAddr)
		if lok && rok {
			if uid, err := socketOwner(ra.AddrPort(), la.AddrPort()); err == nil {
				return "uid=" + strconv.FormatUint(uint64(uid), 10)
			}
		}
	}
	return "-"
}

// commandWord is the first word of a command line when it is made of
// letters only, or "opN" for a gateway command.
func commandWord(p []byte) string {
	if t := bytes.TrimSpace(p); len(t) > 0 && t[0] == '{' {
		var cmd struct{ Op *int }
		if json.Unmarshal(t, &cmd) == nil && cmd.Op != nil {
			return "op" + strconv.Itoa(*cmd.Op)
		}
		return ""
	}
	w, _, _ := strings.Cut(strings.TrimSpace(string(p[:min(len(p), 64)])), " ")
	if w == "" || len(w) > 32 {
		return ""
	}
	for _, r := range w {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') {
			return ""
		}
	}
	return w
}

// audit records a command line p that c accepted: a log line, and
// Server.Audit when set.
func (s *session) audit(c *Ctl, p []byte) {
	file := c.Path
	if file == "" {
		file = c.Name
	}
	r := AuditRecord{Listener: "-", Peer: "-", Who: "-", File: file, Bytes: len(p), Command: commandWord(p)}
	if s.conn != nil {
		r.Listener, r.Peer, r.Who = s.conn.listener, s.conn.remote(), s.conn.who
		if r.Peer == "" {
			r.Peer = "-" // a unix socket's client is unnamed
		}
	}
	s.logger().Info("fsrv: write", "listener", r.Listener, "peer", r.Peer, "who", r.Who, "file", r.File, "bytes", r.Bytes, "cmd", r.Command)
	if s.Audit != nil {
		s.Audit(r)
	}
}
