module github.com/shardfs/shardfs/interop

go 1.26.0

require (
	github.com/bwmarrin/discordgo v0.29.0
	github.com/disgoorg/disgo v0.18.15
	github.com/gorilla/websocket v1.5.3
	github.com/shardfs/shardfs v0.0.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/disgoorg/json v1.2.0 // indirect
	github.com/disgoorg/snowflake/v2 v2.0.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/sasha-s/go-csync v0.0.0-20240107134140-fcbab37b09ad // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/shardfs/shardfs => ../
