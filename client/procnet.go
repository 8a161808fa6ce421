package client

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tcpState values of /proc/net/tcp's st column (include/net/tcp_states.h).
const (
	tcpListen = 0x0A
)

// tcpSocket is one line of /proc/net/tcp or /proc/net/tcp6.
type tcpSocket struct {
	local, remote netip.AddrPort
	state         int
	uid           uint32
}

// loopbackServerUID is the uid that owns the server's end of the TCP
// connection local -> remote, by the kernel's word in /proc/net/tcp and
// /proc/net/tcp6: the socket whose local address is remote and whose
// peer is local (accepted sockets, and those still in the handshake
// queue, carry the listening socket's owner), else the socket listening
// on remote's port. The kernel keeps no SO_PEERCRED for TCP, so this is
// how a client tells that a loopback port is served by its own user and
// not by another local user who bound it first.
func loopbackServerUID(local, remote netip.AddrPort) (uint32, error) {
	var socks []tcpSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		s, err := readProcNetTCP(f)
		if err != nil && !(errors.Is(err, os.ErrNotExist) && f == "/proc/net/tcp6") {
			return 0, err
		}
		socks = append(socks, s...)
	}
	return serverUID(socks, local, remote)
}

// serverUID is loopbackServerUID over socks, read already.
func serverUID(socks []tcpSocket, local, remote netip.AddrPort) (uint32, error) {
	local, remote = unmapped(local), unmapped(remote)
	for _, s := range socks {
		if s.state != tcpListen && s.local == remote && s.remote == local {
			return s.uid, nil
		}
	}
	for _, s := range socks {
		if s.state == tcpListen && s.local.Port() == remote.Port() &&
			(s.local.Addr() == remote.Addr() || s.local.Addr().IsUnspecified()) {
			return s.uid, nil
		}
	}
	return 0, fmt.Errorf("no socket serves %v for %v in /proc/net/tcp or tcp6", remote, local)
}

// unmapped turns ::ffff:127.0.0.1 (a dual-stack socket's view of an
// IPv4 peer) into 127.0.0.1.
func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

func readProcNetTCP(file string) ([]tcpSocket, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseProcNetTCP(f)
}

// parseProcNetTCP reads the table of /proc/net/tcp or tcp6:
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
//
// Addresses are hex words in the host's byte order, ports hex.
func parseProcNetTCP(r io.Reader) ([]tcpSocket, error) {
	var out []tcpSocket
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false // the header
			continue
		}
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 {
			continue
		}
		local, err1 := parseHexAddrPort(fl[1])
		remote, err2 := parseHexAddrPort(fl[2])
		st, err3 := strconv.ParseUint(fl[3], 16, 8)
		uid, err4 := strconv.ParseUint(fl[7], 10, 32)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("a line of /proc/net/tcp: %q: %w", sc.Text(), err)
		}
		out = append(out, tcpSocket{local: unmapped(local), remote: unmapped(remote), state: int(st), uid: uint32(uid)})
	}
	return out, sc.Err()
}

// parseHexAddrPort reads "0100007F:1608" (127.0.0.1:5640 on a
// little-endian machine) or its 32-hex-digit IPv6 form.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q: no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("%q: not an address", s)
	}
	// Each 32-bit word was printed as a number in the host's byte order.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a, uint16(port)), nil
}
