// A discord.js v14 bot that keeps its gateway session across processes:
// it writes @discordjs/ws's session info (session id, sequence, resume
// URL) to SESSION_FILE whenever it changes, and a new process that finds
// the file resumes that session instead of identifying. discord.js 14.28
// keeps the info on its WebSocketShard (retrieveSessionInfo and
// updateSessionInfo read and write shard.sessionInfo) and offers no option
// for them, so the bot wraps the two in its ws.buildStrategy, the hook
// discord.js passes to @discordjs/ws. @discordjs/ws writes the sequence
// before it hands the event on, so the file never names an event the bot
// has not been given.
//
// A resumed process gets no READY, so discord.js never turns ready and
// keeps the dispatches for later; the bot prints them from the raw event,
// which discord.js emits for every dispatch: "RAW content" per
// MESSAGE_CREATE, "RESUMED n" with the events replayed.
'use strict';
const fs = require('node:fs');
const { Client, Events, GatewayIntentBits, SimpleShardingStrategy } = require('discord.js');

const file = process.env.SESSION_FILE;
const saved = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')) : {};

const client = new Client({
  intents: [GatewayIntentBits.Guilds, GatewayIntentBits.GuildMessages, GatewayIntentBits.MessageContent],
  shards: [Number(process.env.SHARD)],
  shardCount: Number(process.env.SHARD_COUNT),
  rest: { api: process.env.RELAY_URL + '/api' },
  ws: {
    buildStrategy: (manager) => {
      const { retrieveSessionInfo, updateSessionInfo } = manager.options;
      manager.options.retrieveSessionInfo = (id) => {
        const info = retrieveSessionInfo(id);
        if (info || !saved[id]) return info;
        // discord.js reads it from its shard too (at Hello, and for
        // shardResume's count of replayed events).
        client.ws.shards.get(id).sessionInfo = saved[id];
        return saved[id];
      };
      manager.options.updateSessionInfo = (id, info) => {
        updateSessionInfo(id, info);
        if (info) saved[id] = info;
        else delete saved[id];
        fs.writeFileSync(file + '.tmp', JSON.stringify(saved));
        fs.renameSync(file + '.tmp', file);
      };
      return new SimpleShardingStrategy(manager);
    },
  },
});

client.once(Events.ClientReady, (c) => console.log(`READY ${c.guilds.cache.size}`));
client.on(Events.ShardResume, (id, replayed) => console.log(`RESUMED ${replayed}`));
client.on(Events.Raw, (p) => {
  if (p.t === 'MESSAGE_CREATE') console.log(`RAW ${p.d.content}`);
});
client.on(Events.Error, (e) => console.log(`ERROR ${e.message}`));
client.login(process.env.BOT_TOKEN);
