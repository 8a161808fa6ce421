// A discord.js v14 bot, unchanged but for its REST base: discord.js asks
// REST for the gateway (GET /gateway/bot), so pointing rest.api at the
// relay points the gateway there too, and its REST goes through the relay.
// It prints one line per thing interop/relay_js_test.go checks.
'use strict';
const { Client, Events, GatewayIntentBits } = require('discord.js');

const client = new Client({
  intents: [GatewayIntentBits.Guilds, GatewayIntentBits.GuildMessages, GatewayIntentBits.MessageContent],
  shards: [Number(process.env.SHARD)],
  shardCount: Number(process.env.SHARD_COUNT),
  rest: { api: process.env.RELAY_URL + '/api' },
});

client.once(Events.ClientReady, (c) => {
  console.log(`READY ${c.guilds.cache.size}`);
  c.user.setPresence({ activities: [{ name: 'relayed' }], status: 'online' });
  console.log('PRESENCE');
});

client.on(Events.MessageCreate, async (m) => {
  console.log(`MSG ${m.content}`);
  if (m.content === 'ping') {
    try {
      await m.channel.send('pong');
      console.log('REPLIED');
    } catch (e) {
      console.log(`REPLY-FAILED ${e.message}`);
    }
  }
});

client.on(Events.ShardResume, () => console.log('RESUMED'));
client.on(Events.Error, (e) => console.log(`ERROR ${e.message}`));

process.on('SIGTERM', () => client.destroy().then(() => process.exit(0)));
client.login(process.env.BOT_TOKEN);
