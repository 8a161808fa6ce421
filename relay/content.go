package relay

import (
	"encoding/json"

	"github.com/shardfs/shardfs/wire"
)

// intentMessageContent is Discord's privileged MESSAGE_CONTENT intent.
const intentMessageContent = 1 << 15

// contentFields are the fields of a message that Discord empties for an
// app without MESSAGE_CONTENT (its "Message Content Intent" section),
// with the value each becomes; nil drops the field (a message without a
// poll has none).
var contentFields = map[string]json.RawMessage{
	"content":     json.RawMessage(`""`),
	"embeds":      json.RawMessage(`[]`),
	"attachments": json.RawMessage(`[]`),
	"components":  json.RawMessage(`[]`),
	"poll":        nil,
}

// withoutContent returns the d of a MESSAGE_CREATE or MESSAGE_UPDATE as
// Discord sends it to an app without MESSAGE_CONTENT: the content fields
// emptied, except in a direct message, in a message the bot (userID)
// wrote, and in one that mentions it. d is returned as is when nothing
// changes.
func withoutContent(d []byte, userID string) []byte {
	if g, ok := wire.Member(d, "guild_id"); !ok || wire.IsNull(g) {
		return d // a DM
	}
	has := false
	for k := range contentFields {
		if _, ok := wire.Member(d, k); ok {
			has = true
			break
		}
	}
	if !has {
		return d // a MESSAGE_UPDATE of other fields: nothing to empty
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(d, &m) != nil {
		return d
	}
	if userID != "" {
		var author struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m["author"], &author) == nil && author.ID == userID {
			return d
		}
		var mentions []struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m["mentions"], &mentions) == nil {
			for _, u := range mentions {
				if u.ID == userID {
					return d
				}
			}
		}
	}
	for k, empty := range contentFields {
		if _, ok := m[k]; !ok {
			continue
		}
		if empty == nil {
			delete(m, k)
		} else {
			m[k] = empty
		}
	}
	return mustMarshal(m)
}

// withoutContent reports whether the session's message content is
// emptied.
func (s *session) withoutContent() bool { return s.noContent }
