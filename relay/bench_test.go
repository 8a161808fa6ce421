package relay

import (
	"encoding/binary"
	"fmt"
	"io"
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
			l, cs, d := benchShard(b, clients)
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

// benchShard is one READY shard with clients identified on it, and the
// data of a MESSAGE_CREATE of about 300 bytes for it.
func benchShard(b *testing.B, clients int) (*shardLog, []*client, string) {
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
	return l, cs, d
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFanout is the relay's own cost of one dispatch delivered to
// each of 1 and 2 clients on a shard. Unlike BenchmarkDelivery, the
// clients do not decode WebSocket messages: each reads the raw socket and
// counts frame headers, so that nearly all of the process's CPU time is
// the writer's append to the journal (a few hundred ns per event) and the
// relay's work (reading the journal, intents, sequence, framing, writing).
// cpu-ns/event/client is the process's CPU time per event and client; the
// second client should cost less than the first.
func BenchmarkFanout(b *testing.B) {
	for _, clients := range []int{1, 2} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			l, cs, d := benchShard(b, clients)
			lines := make([][]byte, b.N)
			for i := range lines {
				lines[i] = fmt.Appendf(nil, `{"shard":0,"s":%d,"t":"MESSAGE_CREATE","session":null,"d":%s}`+"\n", l.seq+1+int64(i), d)
			}
			now := time.Now()
			cpu0 := cpuTime()
			b.ResetTimer()
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Go(func() {
					if err := countFrames(c.ws.NetConn(), b.N); err != nil {
						b.Error(err)
					}
				})
			}
			for _, line := range lines {
				l.log.Append(line, now)
			}
			wg.Wait()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*clients), "ns/event/client")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*clients), "cpu-ns/event/client")
		})
	}
}

// countFrames reads n unmasked WebSocket frames from the server's side of
// a connection without decoding their payloads.
func countFrames(r io.Reader, n int) error {
	buf := make([]byte, 256<<10)
	have, skip := 0, 0 // bytes in buf; payload bytes still to pass over
	for n > 0 {
		m, err := r.Read(buf[have:])
		if err != nil {
			return err
		}
		have += m
		p := buf[:have]
		for n > 0 {
			if skip > 0 {
				if len(p) == 0 {
					break
				}
				k := min(skip, len(p))
				skip -= k
				p = p[k:]
				continue
			}
			hdr := 2
			if len(p) >= 2 {
				switch p[1] & 0x7f {
				case 126:
					hdr = 4
				case 127:
					hdr = 10
				}
			}
			if len(p) < hdr {
				break
			}
			size := int(p[1] & 0x7f)
			switch hdr {
			case 4:
				size = int(binary.BigEndian.Uint16(p[2:]))
			case 10:
				size = int(binary.BigEndian.Uint64(p[2:]))
			}
			p, skip = p[hdr:], size
			n--
		}
		have = copy(buf, p)
	}
	return nil
}
