// A music bot's shape with discord.js v14, without @discordjs/voice: the
// guild's voiceAdapterCreator, the hook @discordjs/voice itself joins
// with, sends op 4 on the shard and is called back with the bot's own
// VOICE_STATE_UPDATE and the guild's VOICE_SERVER_UPDATE, which a voice
// library needs to connect. With JOIN=1 it joins the first guild's
// channel 7; every process prints the voice events it gets.
'use strict';
const { Client, Events, GatewayIntentBits } = require('discord.js');

const client = new Client({
  intents: [GatewayIntentBits.Guilds, GatewayIntentBits.GuildVoiceStates, GatewayIntentBits.GuildMessages,
    GatewayIntentBits.MessageContent],
  shards: [Number(process.env.SHARD)],
  shardCount: Number(process.env.SHARD_COUNT),
  rest: { api: process.env.RELAY_URL + '/api' },
});

client.once(Events.ClientReady, (c) => {
  console.log(`READY ${c.guilds.cache.size} ${c.user.id}`);
  if (process.env.JOIN !== '1') return;
  const guild = c.guilds.cache.first();
  const adapter = guild.voiceAdapterCreator({
    onVoiceServerUpdate: (d) => console.log(`ADAPTER SERVER ${d.guild_id} ${d.endpoint}`),
    onVoiceStateUpdate: (d) => console.log(`ADAPTER STATE ${d.user_id} ${d.channel_id}`),
    destroy: () => {},
  });
  const sent = adapter.sendPayload({ op: 4, d: { guild_id: guild.id, channel_id: '7', self_mute: false, self_deaf: true } });
  console.log(`JOIN ${guild.id} ${sent}`);
});

client.on(Events.Raw, (p) => {
  if (p.t === 'VOICE_STATE_UPDATE' || p.t === 'VOICE_SERVER_UPDATE') console.log(`VOICE ${p.t}`);
});
client.on(Events.MessageCreate, (m) => console.log(`MSG ${m.content}`));
client.on(Events.Error, (e) => console.log(`ERROR ${e.message}`));
client.login(process.env.BOT_TOKEN);
