package relay

import "encoding/json"

// Discord's intent bits (Gateway page, "List of Intents").
const (
	intentGuilds                 = 1 << 0
	intentGuildMembers           = 1 << 1
	intentGuildModeration        = 1 << 2
	intentGuildExpressions       = 1 << 3
	intentGuildIntegrations      = 1 << 4
	intentGuildWebhooks          = 1 << 5
	intentGuildInvites           = 1 << 6
	intentGuildVoiceStates       = 1 << 7
	intentGuildPresences         = 1 << 8
	intentGuildMessages          = 1 << 9
	intentGuildMessageReactions  = 1 << 10
	intentGuildMessageTyping     = 1 << 11
	intentDirectMessages         = 1 << 12
	intentDirectMessageReactions = 1 << 13
	intentDirectMessageTyping    = 1 << 14
	intentGuildScheduledEvents   = 1 << 16
	intentAutoModConfiguration   = 1 << 20
	intentAutoModExecution       = 1 << 21
	intentGuildMessagePolls      = 1 << 24
	intentDirectMessagePolls     = 1 << 25
)

// eventIntents says which intents deliver an event: guild is the intent
// for the event in a guild, dm the one in a direct message (0 when the
// event has no DM form). An event not listed needs no intent.
var eventIntents = map[string]struct{ guild, dm uint64 }{
	"GUILD_CREATE": {intentGuilds, 0}, "GUILD_UPDATE": {intentGuilds, 0}, "GUILD_DELETE": {intentGuilds, 0},
	"GUILD_ROLE_CREATE": {intentGuilds, 0}, "GUILD_ROLE_UPDATE": {intentGuilds, 0}, "GUILD_ROLE_DELETE": {intentGuilds, 0},
	"CHANNEL_CREATE": {intentGuilds, 0}, "CHANNEL_UPDATE": {intentGuilds, 0}, "CHANNEL_DELETE": {intentGuilds, 0},
	"CHANNEL_PINS_UPDATE": {intentGuilds, intentDirectMessages},
	"THREAD_CREATE":       {intentGuilds, 0}, "THREAD_UPDATE": {intentGuilds, 0}, "THREAD_DELETE": {intentGuilds, 0},
	"THREAD_LIST_SYNC": {intentGuilds, 0}, "THREAD_MEMBER_UPDATE": {intentGuilds, 0},
	"STAGE_INSTANCE_CREATE": {intentGuilds, 0}, "STAGE_INSTANCE_UPDATE": {intentGuilds, 0}, "STAGE_INSTANCE_DELETE": {intentGuilds, 0},
	"GUILD_MEMBER_ADD": {intentGuildMembers, 0}, "GUILD_MEMBER_UPDATE": {intentGuildMembers, 0}, "GUILD_MEMBER_REMOVE": {intentGuildMembers, 0},
	"THREAD_MEMBERS_UPDATE":        {intentGuildMembers, 0},
	"GUILD_AUDIT_LOG_ENTRY_CREATE": {intentGuildModeration, 0}, "GUILD_BAN_ADD": {intentGuildModeration, 0}, "GUILD_BAN_REMOVE": {intentGuildModeration, 0},
	"GUILD_EMOJIS_UPDATE": {intentGuildExpressions, 0}, "GUILD_STICKERS_UPDATE": {intentGuildExpressions, 0},
	"GUILD_SOUNDBOARD_SOUND_CREATE": {intentGuildExpressions, 0}, "GUILD_SOUNDBOARD_SOUND_UPDATE": {intentGuildExpressions, 0},
	"GUILD_SOUNDBOARD_SOUND_DELETE": {intentGuildExpressions, 0}, "GUILD_SOUNDBOARD_SOUNDS_UPDATE": {intentGuildExpressions, 0},
	"GUILD_INTEGRATIONS_UPDATE": {intentGuildIntegrations, 0}, "INTEGRATION_CREATE": {intentGuildIntegrations, 0},
	"INTEGRATION_UPDATE": {intentGuildIntegrations, 0}, "INTEGRATION_DELETE": {intentGuildIntegrations, 0},
	"WEBHOOKS_UPDATE": {intentGuildWebhooks, 0},
	"INVITE_CREATE":   {intentGuildInvites, 0}, "INVITE_DELETE": {intentGuildInvites, 0},
	"VOICE_STATE_UPDATE": {intentGuildVoiceStates, 0}, "VOICE_CHANNEL_EFFECT_SEND": {intentGuildVoiceStates, 0},
	"PRESENCE_UPDATE": {intentGuildPresences, 0},
	"MESSAGE_CREATE":  {intentGuildMessages, intentDirectMessages}, "MESSAGE_UPDATE": {intentGuildMessages, intentDirectMessages},
	"MESSAGE_DELETE": {intentGuildMessages, intentDirectMessages}, "MESSAGE_DELETE_BULK": {intentGuildMessages, 0},
	"MESSAGE_REACTION_ADD":          {intentGuildMessageReactions, intentDirectMessageReactions},
	"MESSAGE_REACTION_REMOVE":       {intentGuildMessageReactions, intentDirectMessageReactions},
	"MESSAGE_REACTION_REMOVE_ALL":   {intentGuildMessageReactions, intentDirectMessageReactions},
	"MESSAGE_REACTION_REMOVE_EMOJI": {intentGuildMessageReactions, intentDirectMessageReactions},
	"TYPING_START":                  {intentGuildMessageTyping, intentDirectMessageTyping},
	"GUILD_SCHEDULED_EVENT_CREATE":  {intentGuildScheduledEvents, 0}, "GUILD_SCHEDULED_EVENT_UPDATE": {intentGuildScheduledEvents, 0},
	"GUILD_SCHEDULED_EVENT_DELETE": {intentGuildScheduledEvents, 0}, "GUILD_SCHEDULED_EVENT_USER_ADD": {intentGuildScheduledEvents, 0},
	"GUILD_SCHEDULED_EVENT_USER_REMOVE": {intentGuildScheduledEvents, 0},
	"AUTO_MODERATION_RULE_CREATE":       {intentAutoModConfiguration, 0}, "AUTO_MODERATION_RULE_UPDATE": {intentAutoModConfiguration, 0},
	"AUTO_MODERATION_RULE_DELETE": {intentAutoModConfiguration, 0}, "AUTO_MODERATION_ACTION_EXECUTION": {intentAutoModExecution, 0},
	"MESSAGE_POLL_VOTE_ADD": {intentGuildMessagePolls, intentDirectMessagePolls}, "MESSAGE_POLL_VOTE_REMOVE": {intentGuildMessagePolls, intentDirectMessagePolls},
}

// covers reports whether a client with intents gets the event typ with
// payload d.
func covers(intents uint64, typ string, d []byte) bool {
	need, ok := eventIntents[typ]
	if !ok {
		return true
	}
	inGuild, inDM := intents&need.guild != 0, need.dm != 0 && intents&need.dm != 0
	if need.dm == 0 || inGuild == inDM {
		// No DM form, or both forms or neither covered: no need to look.
		return inGuild || inDM
	}
	var g struct {
		GuildID *string `json:"guild_id"`
	}
	if json.Unmarshal(d, &g) != nil {
		return false
	}
	if g.GuildID != nil {
		return inGuild
	}
	return inDM
}
