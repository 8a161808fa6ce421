package gatewaysim

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// Gateway opcodes. The simulator keeps its own copy so that it shares no
// code with the client in package gateway.
const (
	opDispatch                = 0
	opHeartbeat               = 1
	opIdentify                = 2
	opPresenceUpdate          = 3
	opVoiceStateUpdate        = 4
	opVoiceServerPing         = 5 // Fluxer only, reserved
	opResume                  = 6
	opReconnect               = 7
	opRequestGuildMembers     = 8
	opInvalidSession          = 9
	opHello                   = 10
	opHeartbeatACK            = 11
	opLazyRequest             = 14 // Fluxer only
	opRequestGuildCounts      = 15 // Fluxer only
	opRequestChannelCounts    = 16 // Fluxer only
	opRequestSoundboardSounds = 31 // Discord only
)

// Close codes the simulator sends, with the meaning both platforms give them.
const (
	CloseNormal               = 1000
	CloseGoingAway            = 1001
	CloseUnknownError         = 4000
	CloseUnknownOpcode        = 4001
	CloseDecodeError          = 4002
	CloseNotAuthenticated     = 4003
	CloseAuthenticationFailed = 4004
	CloseAlreadyAuthenticated = 4005
	CloseInvalidSeq           = 4007
	CloseRateLimited          = 4008
	CloseSessionTimedOut      = 4009
	CloseInvalidShard         = 4010
	CloseShardingRequired     = 4011
	CloseInvalidAPIVersion    = 4012
	CloseInvalidIntents       = 4013 // Discord only
	CloseDisallowedIntents    = 4014 // Discord only
)

// MaxPayload is the largest client payload either platform accepts, in bytes,
// on the wire and (Fluxer) after decompression.
const MaxPayload = 4096

// MaxGuildsPerShard is the number of guilds above which identify closes 4011.
const MaxGuildsPerShard = 2500

// Intent bits from Discord's documentation.
const (
	IntentGuilds         uint64 = 1 << 0
	IntentGuildMembers   uint64 = 1 << 1 // privileged
	IntentGuildPresences uint64 = 1 << 8 // privileged
	IntentGuildMessages  uint64 = 1 << 9
	IntentDirectMessages uint64 = 1 << 12
	IntentMessageContent uint64 = 1 << 15 // privileged

	// PrivilegedIntents must be enabled for the bot (see Config.DeniedIntents).
	PrivilegedIntents = IntentGuildMembers | IntentGuildPresences | IntentMessageContent
	// ValidIntents are the bits Discord documents: 0–16, 20, 21, 24, 25.
	ValidIntents uint64 = 1<<17 - 1 | 1<<20 | 1<<21 | 1<<24 | 1<<25
)

// command is one decoded client payload.
type command struct {
	Op int
	D  json.RawMessage
}

var errDecode = errors.New("decode error")

// parseCommand decodes one client payload: a JSON object whose "op" is an
// integer. Anything else is a decode error (4002).
func parseCommand(data []byte) (command, error) {
	var p struct {
		Op *json.Number    `json:"op"`
		D  json.RawMessage `json:"d"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&p); err != nil {
		return command{}, errDecode
	}
	if dec.More() {
		return command{}, errDecode
	}
	if p.Op == nil {
		return command{}, errDecode
	}
	op, err := strconv.ParseInt(p.Op.String(), 10, 32)
	if err != nil {
		return command{}, errDecode
	}
	return command{Op: int(op), D: p.D}, nil
}

// isNull reports whether d is absent or the JSON literal null.
func isNull(d json.RawMessage) bool {
	d = bytes.TrimSpace(d)
	return len(d) == 0 || bytes.Equal(d, []byte("null"))
}

// parseSeq decodes a sequence field: null or absent means none (-1), and a
// non-negative integer is a sequence. ok is false for anything else.
func parseSeq(d json.RawMessage) (seq int64, ok bool) {
	if isNull(d) {
		return -1, true
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(d)), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// identifyData is the d of an Identify. Fields stay raw so that each one is
// judged by the close code its own rule calls for.
type identifyData struct {
	Token   json.RawMessage `json:"token"`
	Intents json.RawMessage `json:"intents"`
	Shard   json.RawMessage `json:"shard"`
}

// resumeData is the d of a Resume.
type resumeData struct {
	Token     json.RawMessage `json:"token"`
	SessionID string          `json:"session_id"`
	Seq       json.RawMessage `json:"seq"`
}

// decodeObject unmarshals d into v, requiring a JSON object.
func decodeObject(d json.RawMessage, v any) error {
	d = bytes.TrimSpace(d)
	if len(d) == 0 || d[0] != '{' {
		return errDecode
	}
	if err := json.Unmarshal(d, v); err != nil {
		return errDecode
	}
	return nil
}

// parseToken returns the token of an identify or resume without the "Bot "
// prefix that some libraries send (discordgo does).
func parseToken(raw json.RawMessage) (string, bool) {
	var tok string
	if err := json.Unmarshal(raw, &tok); err != nil {
		return "", false
	}
	if len(tok) > 4 && tok[:4] == "Bot " {
		tok = tok[4:]
	}
	return tok, tok != ""
}

// parseShard decodes the shard pair of an identify; absent means [0, 1].
func parseShard(raw json.RawMessage) (id, total int, ok bool) {
	if isNull(raw) {
		return 0, 1, true
	}
	var pair []json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&pair); err != nil || len(pair) != 2 {
		return 0, 0, false
	}
	a, err1 := strconv.ParseInt(pair[0].String(), 10, 32)
	b, err2 := strconv.ParseInt(pair[1].String(), 10, 32)
	if err1 != nil || err2 != nil || b < 1 || a < 0 || a >= b {
		return 0, 0, false
	}
	return int(a), int(b), true
}

// parseIntents decodes the intents bit field; it must be present and a
// non-negative integer on Discord v10.
func parseIntents(raw json.RawMessage) (uint64, bool) {
	if isNull(raw) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// clientOp reports whether op is one a client may send to the flavor.
func clientOp(f Flavor, op int) bool {
	switch op {
	case opHeartbeat, opIdentify, opPresenceUpdate, opVoiceStateUpdate, opResume, opRequestGuildMembers:
		return true
	case opRequestSoundboardSounds:
		return f == Discord
	case opVoiceServerPing, opLazyRequest, opRequestGuildCounts, opRequestChannelCounts:
		return f == Fluxer
	}
	return false
}

// appendDispatch appends the JSON of a dispatch; a negative seq is sent as
// null.
func appendDispatch(b []byte, seq int64, name string, d []byte) []byte {
	b = append(b, `{"op":0,"s":`...)
	if seq < 0 {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, seq, 10)
	}
	b = append(b, `,"t":"`...)
	b = append(b, name...)
	b = append(b, `","d":`...)
	if len(d) == 0 {
		d = []byte("{}")
	}
	b = append(b, d...)
	return append(b, '}')
}

// validEventName accepts the upper-case names dispatches use, so that a name
// can be written into JSON without escaping.
func validEventName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

var (
	helloTemplate      = `{"op":10,"d":{"heartbeat_interval":%d}}`
	heartbeatACK       = []byte(`{"op":11,"d":null}`)
	heartbeatRequest   = []byte(`{"op":1,"d":null}`)
	reconnectPayload   = []byte(`{"op":7,"d":null}`)
	invalidSessionTrue = []byte(`{"op":9,"d":true}`)
	invalidSessionNo   = []byte(`{"op":9,"d":false}`)
	unknownOpPayload   = []byte(`{"op":42,"d":{"simulated":"unknown opcode"}}`)
	invalidJSONPayload = []byte(`{"op":0,"s":`)
)
