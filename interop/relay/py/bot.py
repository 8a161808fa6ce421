"""A discord.py 2.x bot, unchanged but for its URLs: REST (Route.BASE) and
the gateway (DiscordWebSocket.DEFAULT_GATEWAY) point at the shardfs relay.
It prints one line per thing interop/relay_discordpy_test.go checks."""
import os

import discord
import yarl

relay = os.environ['RELAY_URL']
discord.http.Route.BASE = relay + '/api/v10'
discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL('ws' + relay[len('http'):] + '/')

intents = discord.Intents.none()
intents.guilds = True
intents.guild_messages = True
intents.message_content = True
intents.members = True
client = discord.Client(intents=intents, shard_id=int(os.environ['SHARD']),
                        shard_count=int(os.environ['SHARD_COUNT']), chunk_guilds_at_startup=False)


def say(line):
    print(line, flush=True)


@client.event
async def on_ready():
    say(f'READY {len(client.guilds)}')
    await client.change_presence(activity=discord.Game('relayed'))
    say('PRESENCE')


@client.event
async def on_message(m):
    say(f'MSG {m.content}')
    if m.content == 'chunk':
        members = await m.guild.chunk()
        say(f'CHUNKED {len(members)}')


client.run(os.environ['BOT_TOKEN'], log_handler=None)
