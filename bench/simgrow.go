package main

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// The simulator commands of the reshard comparison.

// grow N: discovery recommends N shards from now on.
func (s *simRole) grow(args []string) (string, error) {
	n, err := argInt(args, 0)
	if err != nil {
		return "", fmt.Errorf("usage: grow N")
	}
	s.srv.SetShards(n)
	return "", nil
}

// close SHARD CODE: the server closes the shard's connections with CODE.
func (s *simRole) closeShard(args []string) (string, error) {
	id, err1 := argInt(args, 0)
	code, err2 := argInt(args, 1)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("usage: close SHARD CODE")
	}
	n := s.srv.Inject(id, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: code, Reason: "closed by the bench"})
	return strconv.Itoa(n), nil
}

// guildTrafficState is the traffic of "guilds": one MESSAGE_CREATE after
// the other to each guild in turn, routed as the gateway routes it to
// every session of either plan.
type guildTrafficState struct {
	mu        sync.Mutex
	stop      chan struct{}
	wg        sync.WaitGroup
	published int // events sequenced into at least one session
	both      int // events sequenced into two sessions (both plans)
}

var guildTraffic guildTrafficState

// guilds RATE COUNT: RATE events per second spread over guilds 1..COUNT;
// 0 stops, and every call answers "published both" so far.
func (s *simRole) guildTraffic(args []string) (string, error) {
	rate, err1 := argInt(args, 0)
	count, err2 := argInt(args, 1)
	if err1 != nil || err2 != nil || count < 1 {
		return "", fmt.Errorf("usage: guilds RATE COUNT")
	}
	s.guildStop()
	g := &guildTraffic
	if rate > 0 {
		g.stop = make(chan struct{})
		g.wg.Add(1)
		go func(stop chan struct{}) {
			defer g.wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				n, _ := s.srv.PublishGuild(gatewaysim.GuildID(1+i%count), gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte(`{"id":"` + strconv.Itoa(i) + `","content":"bench"}`)})
				g.mu.Lock()
				if n > 0 {
					g.published++
				}
				if n > 1 {
					g.both++
				}
				g.mu.Unlock()
			}
		}(g.stop)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return fmt.Sprintf("%d %d", g.published, g.both), nil
}

func (s *simRole) guildStop() {
	g := &guildTraffic
	if g.stop != nil {
		close(g.stop)
		g.wg.Wait()
		g.stop = nil
	}
}
