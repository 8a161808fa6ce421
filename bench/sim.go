package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// runSim is the "sim" role: a Discord-flavour gatewaysim.Server in a
// process of its own.
func runSim(args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	shards := fs.Int("shards", 1, "the bot's shard count (discovery)")
	mc := fs.Int("max-concurrency", 0, "max_concurrency (default: shards)")
	window := fs.Duration("identify-interval", 5*time.Second, "identify window per bucket")
	heartbeat := fs.Duration("heartbeat", 41250*time.Millisecond, "heartbeat interval")
	heartbeatTimeout := fs.Duration("heartbeat-timeout", 0, "close 4009 after this long without a heartbeat (default: the simulator's, 12/11 of the interval)")
	tlsDir := fs.String("tls", "", "serve over TLS with the certificate and key in this directory (cert.pem, key.pem)")
	guilds := fs.Int("guilds", 0, "the bot's guild count (default: shards)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mc <= 0 {
		*mc = *shards
	}
	var tc *tls.Config
	if *tlsDir != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(*tlsDir, "cert.pem"), filepath.Join(*tlsDir, "key.pem"))
		if err != nil {
			return err
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	srv, err := gatewaysim.New(gatewaysim.Config{
		TLS:               tc,
		Flavor:            gatewaysim.Discord,
		Token:             os.Getenv(tokenEnv),
		Shards:            *shards,
		Guilds:            *guilds,
		MaxConcurrency:    *mc,
		IdentifyInterval:  *window,
		SessionStartLimit: 1 << 24,
		HeartbeatInterval: *heartbeat,
		HeartbeatTimeout:  *heartbeatTimeout,
		MaxQueuedFrames:   1 << 20,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	s := &simRole{srv: srv}
	serveCommands(srv.APIURL()+" "+srv.GatewayURL(), map[string]func([]string) (string, error){
		"stats":     s.stats,
		"flood":     s.flood,
		"traffic":   s.traffic,
		"wait-live": s.waitLive,
		"recover":   s.recover,
		"seqs":      s.seqs,
		"flap":      s.flap,
		"grow":      s.grow,
		"close":     s.closeShard,
		"guilds":    s.guildTraffic,
	})
	s.guildStop()
	s.flapStop()
	return nil
}

type simRole struct {
	srv *gatewaysim.Server

	flapMu   sync.Mutex
	flapDone chan struct{}
	flapWG   sync.WaitGroup
	flapped  int
}

// stats: the simulator's totals as JSON.
func (s *simRole) stats([]string) (string, error) {
	b, err := json.Marshal(s.srv.Totals())
	return string(b), err
}

// flood FROM TO N: N MESSAGE_CREATEs to every shard in [FROM, TO], as fast
// as each connection takes them.
func (s *simRole) flood(args []string) (string, error) {
	from, err1 := argInt(args, 0)
	to, err2 := argInt(args, 1)
	n, err3 := argInt(args, 2)
	if err1 != nil || err2 != nil || err3 != nil {
		return "", fmt.Errorf("usage: flood FROM TO N")
	}
	sessions := 0
	for id := from; id <= to; id++ {
		sessions += s.srv.Flood(id, n)
	}
	return strconv.Itoa(sessions), nil
}

// traffic RATE [TICK]: MESSAGE_CREATEs per second per shard (0 stops),
// generated every TICK (default the simulator's 100 ms; a latency
// measurement wants a short one, so that events are not sent in bursts).
func (s *simRole) traffic(args []string) (string, error) {
	if len(args) != 1 && len(args) != 2 {
		return "", fmt.Errorf("usage: traffic RATE [TICK]")
	}
	rate, err := strconv.ParseFloat(args[0], 64)
	if err != nil {
		return "", err
	}
	t := gatewaysim.Traffic{PerShard: rate}
	if len(args) == 2 {
		if t.Tick, err = time.ParseDuration(args[1]); err != nil {
			return "", err
		}
	}
	s.srv.SetTraffic(t)
	return "", nil
}

// allLive reports whether every shard in [0, n) has exactly one session on
// a connection and, when base is given, has answered a resume or an
// identify since base was taken.
func allLive(all map[int]gatewaysim.ShardStats, n int, base map[int]gatewaysim.ShardStats) bool {
	for id := range n {
		st := all[id]
		if st.LiveSessions != 1 {
			return false
		}
		if base != nil {
			b := base[id]
			if st.Resumes+st.Identifies <= b.Resumes+b.Identifies {
				return false
			}
		}
	}
	return true
}

// pollEvery is how often the simulator role checks a condition. It polls
// rather than waking on every change: a change notification per heartbeat
// of 16,384 shards, each followed by a scan of all of them, would cost more
// than the clients being measured.
const pollEvery = 2 * time.Millisecond

// wait-live N TIMEOUT: waits until shards [0, N) all have a live session
// and answers with the Unix time in nanoseconds at which that was seen.
func (s *simRole) waitLive(args []string) (string, error) {
	n, err1 := argInt(args, 0)
	timeout, err2 := argDuration(args, 1)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("usage: wait-live N TIMEOUT")
	}
	deadline := time.Now().Add(timeout)
	for {
		if allLive(s.srv.AllStats(), n, nil) {
			return strconv.FormatInt(time.Now().UnixNano(), 10), nil
		}
		if time.Now().After(deadline) {
			t := s.srv.Totals()
			return "", fmt.Errorf("after %v: %d live sessions of %d, %d identifies, %d refused", timeout, t.LiveSessions, n, t.Identifies, t.RefusedIdentifies)
		}
		time.Sleep(pollEvery)
	}
}

// recover N TIMEOUT: drops every connection at once (FaultDrop: TCP closed
// without a close frame, sessions kept) and waits until every shard in
// [0, N) is live again after a resume or an identify. It answers with the
// time that took in nanoseconds, the resumes, identifies and failed
// resumes since the drop, and the connections dropped.
func (s *simRole) recover(args []string) (string, error) {
	n, err1 := argInt(args, 0)
	timeout, err2 := argDuration(args, 1)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("usage: recover N TIMEOUT")
	}
	base := s.srv.AllStats()
	before := s.srv.Totals()
	start := time.Now()
	dropped := s.srv.Inject(gatewaysim.AllShards, gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	for {
		if allLive(s.srv.AllStats(), n, base) {
			break
		}
		if time.Since(start) > timeout {
			return "", fmt.Errorf("not recovered after %v: %d live", timeout, s.srv.Totals().LiveSessions)
		}
		time.Sleep(pollEvery)
	}
	elapsed := time.Since(start)
	after := s.srv.Totals()
	return fmt.Sprintf("%d %d %d %d %d", elapsed.Nanoseconds(), after.Resumes-before.Resumes,
		after.Identifies-before.Identifies, after.FailedResumes-before.FailedResumes, dropped), nil
}

// seqs N: for each shard in [0, N), the last sequence its session was
// given, or -1 when the shard does not have exactly one session.
func (s *simRole) seqs(args []string) (string, error) {
	n, err := argInt(args, 0)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for id := range n {
		ss := s.srv.Sessions(id)
		seq := int64(-1)
		if len(ss) == 1 {
			seq = ss[0].Seq
		}
		if id > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatInt(seq, 10))
	}
	return b.String(), nil
}

// flapFaults are faults a client recovers from by resuming.
var flapFaults = []gatewaysim.Fault{
	{Kind: gatewaysim.FaultDrop},
	{Kind: gatewaysim.FaultClose, Code: 4000},
	{Kind: gatewaysim.FaultReconnect},
}

// flap N RATE: injects resumable faults into random shards of [0, N) at
// RATE per second until "flap 0 0"; stopping answers how many were
// injected.
func (s *simRole) flap(args []string) (string, error) {
	n, err1 := argInt(args, 0)
	rate, err2 := argInt(args, 1)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("usage: flap N RATE")
	}
	injected := s.flapStop()
	if rate <= 0 || n <= 0 {
		return strconv.Itoa(injected), nil
	}
	s.flapMu.Lock()
	defer s.flapMu.Unlock()
	done := make(chan struct{})
	s.flapDone = done
	s.flapped = 0
	s.flapWG.Go(func() {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			s.srv.Inject(rng.IntN(n), flapFaults[rng.IntN(len(flapFaults))])
			s.flapMu.Lock()
			s.flapped++
			s.flapMu.Unlock()
		}
	})
	return "0", nil
}

func (s *simRole) flapStop() int {
	s.flapMu.Lock()
	done := s.flapDone
	s.flapDone = nil
	s.flapMu.Unlock()
	if done != nil {
		close(done)
		s.flapWG.Wait()
	}
	s.flapMu.Lock()
	defer s.flapMu.Unlock()
	return s.flapped
}
