package relay

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDelivery is the cost of one dispatch delivered to each of 1
// and 2 clients: the shard's journal gets b.N MESSAGE_CREATEs of about
// 300 bytes, each client's puller frames and writes them, and the
// clients, in this process, read the frames without decoding them (their
// reading is part of the figure). ns/event/client is wall time per event
// and client; cpu-ns/event/client the whole process's CPU time (the
// writer, the relay and the reading clients) per event and client.
func BenchmarkDelivery(b *testing.B) {
	for _, clients := range []int{1, 2} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			r := newRigSized(b, 1, []int{0}, 64<<20, nil)
			l := r.shards[0]
			l.ready(1)
			var cs []*client
			for range clients {
				c := r.dial("")
				c.ready(0, 1, 1, allIntent)
				cs = append(cs, c)
			}
			d := `{"id":"1","channel_id":"7","guild_id":"` + guildID(0) + `","content":"the quick brown fox jumps over the lazy dog the quick brown fox jumps over the lazy dog","author":{"id":"5","username":"u"},"type":0,"tts":false,"mentions":[],"embeds":[],"attachments":[]}`
			cpu0 := cpuTime()
			b.ResetTimer()
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Go(func() {
					for range b.N {
						if _, _, err := c.ws.ReadMessage(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			for range b.N {
				l.dispatch("MESSAGE_CREATE", d)
			}
			wg.Wait()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*clients), "ns/event/client")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*clients), "cpu-ns/event/client")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
