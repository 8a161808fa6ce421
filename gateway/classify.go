package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gorilla/websocket"
	"github.com/shardfs/shardfs/core"
)

// ClassifyClose says what a close code from the gateway means for the
// session, as DESIGN.md section 3 lays out: the codes that no retry can fix
// are fatal (Fluxer has no 4013 or 4014, so those are transient there),
// 4007, 4009, 1000 and 1001 need a new session, and everything else,
// including 1005 (no code) and 1006 (dropped), is transient.
func ClassifyClose(flavor core.Flavor, code int) core.FailureClass {
	switch code {
	case 4004, 4010, 4011, 4012:
		return core.FatalFailure
	case 4013, 4014:
		if flavor == core.Discord {
			return core.FatalFailure
		}
	case 4007, 4009, websocket.CloseNormalClosure, websocket.CloseGoingAway:
		return core.NewSession
	}
	return core.Transient
}

// closeNames are the meanings both platforms document, for error messages.
var closeNames = map[int]string{
	1000: "normal closure", 1001: "going away", 1005: "no status code", 1006: "connection dropped",
	4000: "unknown error", 4001: "unknown opcode", 4002: "decode error",
	4003: "not authenticated", 4004: "authentication failed", 4005: "already authenticated",
	4007: "invalid sequence", 4008: "rate limited", 4009: "session timed out",
	4010: "invalid shard", 4011: "sharding required", 4012: "invalid API version",
	4013: "invalid intents", 4014: "disallowed intents",
}

// fault says which layer a failure concerns, for the TCP, TLS and
// WebSocket states the core logs.
type fault uint8

const (
	faultProtocol  fault = iota // the gateway broke the protocol; the client closes
	faultServer                 // the gateway closed the WebSocket
	faultIO                     // the connection broke under the WebSocket
	faultTCP                    // TCP connect failed
	faultTLS                    // TLS handshake failed
	faultUpgrade                // the WebSocket upgrade failed
	faultDiscovery              // discovery failed; nothing was dialled
	faultStalled                // the gateway stopped answering (zombie, timeouts)
)

// connError is a classified failure of one connection.
type connError struct {
	class core.FailureClass
	fault fault
	code  int  // close code involved, 0 when none
	now   bool // reconnect at once (op 7)
	err   error
}

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// apply marks the failed layer in cs.
func (e *connError) apply(cs *core.ConnState) {
	switch e.fault {
	case faultProtocol, faultServer:
		cs.WS = core.LayerClosed
	case faultIO:
		cs.TCP, cs.WS = core.LayerFailed, core.LayerFailed
	case faultTCP:
		cs.TCP = core.LayerFailed
	case faultTLS:
		cs.TLS = core.LayerFailed
	case faultUpgrade, faultStalled:
		cs.WS = core.LayerFailed
	}
}

func transient(f fault, err error) *connError {
	return &connError{class: core.Transient, fault: f, err: err}
}

// errBinaryFrame: a gateway that compresses sends binary frames, one that
// does not sends text (JSON is text); a binary frame on a connection that
// is not compressed is refused like a text frame inside a compressed
// stream, rather than taken as JSON it was never said to be.
var errBinaryFrame = errors.New("binary frame on an uncompressed connection")

// errClosing ends a connection the core or the transport closed.
var errClosing = errors.New("connection closed by the client")

// classify turns the error that ended a connection's reader into a
// failure.
func (c *conn) classify(err error) *connError {
	var ce *connError
	if errors.As(err, &ce) {
		return ce
	}
	var wc *websocket.CloseError
	if errors.As(err, &wc) {
		if wc.Code == websocket.CloseAbnormalClosure {
			return &connError{class: core.Transient, fault: faultIO, code: wc.Code, err: errors.New("connection dropped without a close frame")}
		}
		name := closeNames[wc.Code]
		if name == "" {
			name = "unlisted code"
		}
		msg := fmt.Sprintf("gateway closed the connection with %d (%s)", wc.Code, name)
		if wc.Text != "" {
			text := wc.Text
			if len(text) > 80 {
				text = text[:80]
			}
			msg += fmt.Sprintf(": %q", text)
		}
		return &connError{class: ClassifyClose(c.t.cfg.Flavor, wc.Code), fault: faultServer, code: wc.Code, err: errors.New(msg)}
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return &connError{class: core.Transient, fault: faultIO, code: websocket.CloseAbnormalClosure, err: fmt.Errorf("connection lost: %w", err)}
	}
	return transient(faultProtocol, fmt.Errorf("gateway sent an unreadable message: %w", err))
}

// closeCodeFor is the code the client closes with after reporting a
// failure of class: 4000 keeps the session for a resume; a session that is
// already gone gets 1000. The core passes its own code, which wins.
func closeCodeFor(class core.FailureClass) int {
	if class == core.NewSession {
		return websocket.CloseNormalClosure
	}
	return 4000
}
