package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"
	disgogw "github.com/disgoorg/disgo/gateway"
	"github.com/disgoorg/disgo/sharding"
)

// peerFlags are the flags of the discordgo and disgo roles.
type peerFlags struct {
	api, gateway string
	shards       int
	total        int
	mc           int
	seqs         bool
	latency      bool          // discordgo: record each MESSAGE_CREATE's age (lat)
	logErrors    bool          // disgo: its errors to stderr
	openTimeout  time.Duration // disgo: give up opening after this long
}

func parsePeerFlags(role string, args []string) (peerFlags, error) {
	var p peerFlags
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.StringVar(&p.api, "api", "", "the simulator's API URL")
	fs.StringVar(&p.gateway, "gateway", "", "the simulator's gateway URL")
	fs.IntVar(&p.shards, "shards", 1, "shards 0..N-1")
	fs.IntVar(&p.total, "total", 0, "the bot's shard count (default: shards)")
	fs.IntVar(&p.mc, "max-concurrency", 1, "max_concurrency")
	fs.BoolVar(&p.seqs, "seqs", false, "record every dispatch sequence, to count lost events")
	fs.BoolVar(&p.latency, "latency", false, "discordgo: record the time from each MESSAGE_CREATE's timestamp (the simulator's send) to its handler")
	fs.BoolVar(&p.logErrors, "log-errors", false, "disgo: log its errors to stderr")
	fs.DurationVar(&p.openTimeout, "open-timeout", 0, "disgo: stop opening after this long (0: never); it retries a failed dial for ever")
	fs.IntVar(&runtime.MemProfileRate, "memprofilerate", runtime.MemProfileRate, "runtime.MemProfileRate, for heapsum")
	if err := fs.Parse(args); err != nil {
		return p, err
	}
	if p.total <= 0 {
		p.total = p.shards
	}
	return p, nil
}

// peerState is what a peer's handlers record: which shards saw READY,
// MESSAGE_CREATEs counted, and optionally every sequence per shard.
type peerState struct {
	readies  []atomic.Bool
	messages atomic.Int64
	seqs     []seqSet
	lat      hist // with -latency: MESSAGE_CREATE timestamp to handler
}

func newPeerState(n int, seqs bool) *peerState {
	p := &peerState{readies: make([]atomic.Bool, n)}
	if seqs {
		p.seqs = make([]seqSet, n)
	}
	return p
}

func (p *peerState) readyCount() int {
	c := 0
	for i := range p.readies {
		if p.readies[i].Load() {
			c++
		}
	}
	return c
}

func (p *peerState) seq(shard int, s int64) {
	if p.seqs != nil && shard >= 0 && shard < len(p.seqs) && s > 0 {
		p.seqs[shard].add(s)
	}
}

// seqSet is the set of sequences a shard received.
type seqSet struct {
	mu   sync.Mutex
	bits []uint64
	n    int
	dups int
}

func (s *seqSet) add(seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := int(seq / 64)
	for len(s.bits) <= w {
		s.bits = append(s.bits, 0)
	}
	if s.bits[w]&(1<<(seq%64)) != 0 {
		s.dups++
		return
	}
	s.bits[w] |= 1 << (seq % 64)
	s.n++
}

// has counts the sequences of [1, upto] in the set.
func (s *seqSet) has(upto int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := 0
	for seq := int64(1); seq <= upto; seq++ {
		if w := int(seq / 64); w < len(s.bits) && s.bits[w]&(1<<(seq%64)) != 0 {
			c++
		}
	}
	return c
}

// peerCommands are the commands both peer roles answer.
func peerCommands(p *peerState, open func() (string, error)) map[string]func([]string) (string, error) {
	return map[string]func([]string) (string, error){
		"open":  func([]string) (string, error) { return open() },
		"ready": func([]string) (string, error) { return strconv.Itoa(p.readyCount()), nil },
		"wait-ready": func(args []string) (string, error) {
			want, err1 := argInt(args, 0)
			timeout, err2 := argDuration(args, 1)
			if err1 != nil || err2 != nil {
				return "", errors.New("usage: wait-ready N TIMEOUT")
			}
			return waitFor(timeout, want, p.readyCount)
		},
		"count": func([]string) (string, error) { return strconv.FormatInt(p.messages.Load(), 10), nil },
		// lat: N P50 P99 MAX in nanoseconds, as the node role answers.
		"lat": func([]string) (string, error) {
			return fmt.Sprintf("%d %.0f %.0f %d", p.lat.n.Load(), p.lat.quantile(0.50), p.lat.quantile(0.99), p.lat.max.Load()), nil
		},
		"lat-reset": func([]string) (string, error) { p.lat.reset(); return "", nil },
		"gc":        collect,
		"heapsum":   heapBreakdown,
		// got UPTO...: for each shard, how many of sequences 1..UPTO it
		// received (the simulator's last sequences, from "seqs").
		"got": func(args []string) (string, error) {
			if p.seqs == nil {
				return "", errors.New("not recording sequences (-seqs)")
			}
			var b strings.Builder
			for i, a := range args {
				upto, err := strconv.ParseInt(a, 10, 64)
				if err != nil {
					return "", err
				}
				if i > 0 {
					b.WriteByte(' ')
				}
				if i < len(p.seqs) {
					b.WriteString(strconv.Itoa(p.seqs[i].has(upto)))
				} else {
					b.WriteString("0")
				}
			}
			return b.String(), nil
		},
	}
}

// runDiscordgo is the "discordgo" role: one discordgo v0.29.0 Session per
// shard, as discordgo users shard (it has no shard manager). State tracking
// is off and events are handled synchronously, its cheapest
// configuration; a handler counts MESSAGE_CREATEs.
func runDiscordgo(args []string) error {
	f, err := parsePeerFlags("discordgo", args)
	if err != nil {
		return err
	}
	api := strings.TrimSuffix(f.api, "/") + "/"
	discordgo.EndpointAPI = api
	discordgo.EndpointGateway = api + "gateway"
	discordgo.EndpointGatewayBot = api + "gateway/bot"
	discordgo.Logger = func(int, int, string, ...any) {}
	st := newPeerState(f.shards, f.seqs)
	sessions := make([]*discordgo.Session, f.shards)
	for i := range sessions {
		s, err := discordgo.New("Bot " + os.Getenv(tokenEnv))
		if err != nil {
			return err
		}
		s.ShardID, s.ShardCount = i, f.total
		s.StateEnabled = false
		s.SyncEvents = true
		s.Compress = false
		s.LogLevel = discordgo.LogError
		s.Identify.Intents = discordgo.IntentsGuilds | discordgo.IntentsGuildMessages
		s.AddHandler(func(*discordgo.Session, *discordgo.Ready) { st.readies[i].Store(true) })
		s.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageCreate) {
			if f.latency {
				// The simulator stamps a message when it makes it, in
				// microseconds; both processes read the same clock.
				st.lat.record(time.Since(m.Timestamp))
			}
			st.messages.Add(1)
		})
		if f.seqs {
			s.AddHandler(func(_ *discordgo.Session, e *discordgo.Event) { st.seq(i, e.Sequence) })
		}
		sessions[i] = s
	}
	opened := false
	open := func() (string, error) {
		if opened {
			return "", errors.New("already open")
		}
		opened = true
		// discordgo's Open blocks until READY; sixteen at a time keep a
		// large test short (the simulator gives every shard its own
		// identify bucket in the memory and throughput comparisons).
		start := time.Now()
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		for _, s := range sessions {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := s.Open(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("shard %d: %w", s.ShardID, err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			return "", fmt.Errorf("%d shards failed to open; first: %w", len(errs), errs[0])
		}
		return strconv.FormatInt(time.Since(start).Milliseconds(), 10), nil
	}
	serveCommands("", peerCommands(st, open))
	for _, s := range sessions {
		_ = s.Close()
	}
	return nil
}

// runDisgo is the "disgo" role: disgo v0.18.15's shard manager with the
// shard ids passed explicitly and opened one at a time with OpenShard (its
// Open creates shards concurrently into an unguarded map above
// max_concurrency 1), its identify rate limiter set to the simulator's
// max_concurrency; a handler counts MESSAGE_CREATEs.
func runDisgo(args []string) error {
	f, err := parsePeerFlags("disgo", args)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if f.logErrors {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	st := newPeerState(f.shards, f.seqs)
	handler := func(_ disgogw.EventType, seq int, shardID int, ev disgogw.EventData) {
		switch ev.(type) {
		case disgogw.EventReady:
			if shardID >= 0 && shardID < len(st.readies) {
				st.readies[shardID].Store(true)
			}
		case disgogw.EventMessageCreate:
			st.messages.Add(1)
		}
		st.seq(shardID, int64(seq))
	}
	ids := make([]int, f.shards)
	for i := range ids {
		ids[i] = i
	}
	m := sharding.New(os.Getenv(tokenEnv), handler,
		sharding.WithShardCount(f.total),
		sharding.WithShardIDs(ids...),
		sharding.WithLogger(log),
		sharding.WithRateLimiterConfigOpt(
			sharding.WithMaxConcurrency(f.mc),
			sharding.WithRateLimiterLogger(log),
		),
		sharding.WithGatewayConfigOpts(
			disgogw.WithURL(f.gateway),
			disgogw.WithCompress(false),
			disgogw.WithIntents(disgogw.IntentGuilds, disgogw.IntentGuildMessages),
			disgogw.WithLogger(log),
			disgogw.WithRateLimiterConfigOpts(disgogw.WithRateLimiterLogger(log)),
		),
	)
	opened := false
	open := func() (string, error) {
		if opened {
			return "", errors.New("already open")
		}
		opened = true
		start := time.Now()
		ctx := context.Background()
		if f.openTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, f.openTimeout)
			defer cancel()
		}
		for _, id := range ids {
			if err := m.OpenShard(ctx, id); err != nil {
				return "", fmt.Errorf("OpenShard(%d): %w", id, err)
			}
		}
		return strconv.FormatInt(time.Since(start).Milliseconds(), 10), nil
	}
	serveCommands("", peerCommands(st, open))
	m.Close(context.Background())
	return nil
}
