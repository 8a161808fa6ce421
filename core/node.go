package core

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/journal"
	"github.com/shardfs/shardfs/wire"
)

// Config configures a Node. Only Plan and Transport are required.
type Config struct {
	Plan      Plan
	Flavor    Flavor
	Transport Transport
	// Pacer grants identify slots; nil means an in-memory Pacer for the
	// flavor (Discord with max_concurrency 1 until told otherwise).
	Pacer IdentifyPacer
	// Lease grants the right to connect; nil refuses lease commands and
	// never gates.
	Lease Lease
	// Backoff is the reconnect policy; nil means DefaultBackoff.
	Backoff BackoffPolicy
	// Send is the command budget; zero means the flavor's.
	Send  SendPolicy
	Clock clock.Clock
	// Rand returns uniform values in [0, 1) for jitter; nil means
	// math/rand/v2.
	Rand   func() float64
	Logger *slog.Logger
	// EventRetention and NodeEventRetention bound each shard's events log
	// and the node's, in bytes (defaults 16 KiB and 1 MiB).
	EventRetention, NodeEventRetention int
	// ObserveEvent, when set, is told how long the core took to handle
	// each lifecycle event (the kinds in EventKinds: transport failures,
	// READY, RESUMED, reconnect, lease and identify-slot timers; never
	// dispatches), from its arrival, waiting for the shard's lock
	// included, to the end of its handling. It is called on the goroutine
	// that delivered the event, after the shard's lock is released, and
	// must be quick.
	ObserveEvent func(kind string, d time.Duration)
}

// ReadyReset is how long a shard must stay READY before its consecutive
// failure count starts again from zero.
const ReadyReset = 60 * time.Second

// Node runs the local shards of a plan.
type Node struct {
	plan      Plan
	flavor    Flavor
	transport Transport
	pacer     IdentifyPacer
	lease     Lease
	backoff   BackoffPolicy
	send      SendPolicy
	clock     clock.Clock
	rand      func() float64
	log       *slog.Logger

	observeEvent func(kind string, d time.Duration)

	shards map[int]*shard // fixed after New
	order  []*shard       // by shard ID
	events *journal.Log
	closed atomic.Bool
	// leaseMu makes each lease command atomic (see applyLease).
	leaseMu sync.Mutex
}

// New validates the plan and returns a node whose shards are all ASSIGNED.
// Nothing connects until Start.
func New(cfg Config) (*Node, error) {
	if err := cfg.Plan.Validate(); err != nil {
		return nil, err
	}
	if cfg.Transport == nil {
		return nil, errors.New("core: Config.Transport is nil")
	}
	n := &Node{
		plan:      Plan{Total: cfg.Plan.Total, Local: cfg.Plan.sorted()},
		flavor:    cfg.Flavor,
		transport: cfg.Transport,
		pacer:     cfg.Pacer,
		lease:     cfg.Lease,
		backoff:   cfg.Backoff,
		send:      cfg.Send,
		clock:     clock.Or(cfg.Clock),
		rand:      cfg.Rand,
		log:       cfg.Logger,

		observeEvent: cfg.ObserveEvent,
	}
	if n.backoff == nil {
		n.backoff = DefaultBackoff
	}
	if n.rand == nil {
		n.rand = rand.Float64
	}
	if n.send.Limit == 0 {
		n.send = DiscordSend
		if n.flavor == Fluxer {
			n.send = FluxerSend
		}
	}
	if n.pacer == nil {
		if n.flavor == Fluxer {
			n.pacer = NewFluxerPacer(n.clock, DefaultFluxerPacing)
		} else {
			n.pacer = NewDiscordPacer(n.clock, 1)
		}
	}
	retention := orDefault(cfg.EventRetention, 16<<10)
	n.events = journal.New(orDefault(cfg.NodeEventRetention, 1<<20))
	n.shards = make(map[int]*shard, len(n.plan.Local))
	n.order = make([]*shard, len(n.plan.Local))
	for i, id := range n.plan.Local {
		s := &shard{node: n, id: id, events: journal.New(retention)}
		n.shards[id] = s
		n.order[i] = s
	}
	return n, nil
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// Plan returns the node's plan, local IDs in ascending order.
func (n *Node) Plan() Plan { return n.plan }

// Flavor returns the gateway flavor.
func (n *Node) Flavor() Flavor { return n.flavor }

// Clock returns the node's clock.
func (n *Node) Clock() clock.Clock { return n.clock }

// Events returns the node's events log (every local shard's lines).
func (n *Node) Events() *journal.Log { return n.events }

// ShardEvents returns one shard's events log.
func (n *Node) ShardEvents(id int) (*journal.Log, error) {
	s, err := n.shard(id)
	if err != nil {
		return nil, err
	}
	return s.events, nil
}

func (n *Node) shard(id int) (*shard, error) {
	if s := n.shards[id]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownShard, id)
}

// Start starts every ASSIGNED shard, in shard order, so that identify slots
// are requested in that order.
func (n *Node) Start() {
	for _, s := range n.order {
		s.startAssigned()
	}
}

// Close stops every shard (closing connections with 4000 so that sessions
// stay resumable) and refuses further commands. FATAL shards stay FATAL.
func (n *Node) Close() {
	if n.closed.Swap(true) {
		return
	}
	for _, s := range n.order {
		s.shutdown()
	}
}

// Diag returns a snapshot of one shard's diagnostics.
func (n *Node) Diag(id int) (Diag, error) {
	s, err := n.shard(id)
	if err != nil {
		return Diag{}, err
	}
	return s.diag(n.clock.Now()), nil
}

// Snapshot appends every local shard's diagnostics, in shard order, to dst.
// It locks one shard at a time, so it never stops the node.
func (n *Node) Snapshot(dst []Diag) []Diag {
	now := n.clock.Now()
	for _, s := range n.order {
		dst = append(dst, s.diag(now))
	}
	return dst
}

// ExecNode parses and applies one line written to the node's ctl file. A
// refused line is logged to the node's events with its reason.
func (n *Node) ExecNode(line string) error {
	c, err := ParseCommand(line)
	if err == nil {
		err = n.Apply(c)
	}
	if err != nil {
		n.reject(nil, line, err)
	}
	return err
}

// ExecShard parses and applies one line written to shard id's ctl file. A
// refused line is logged to that shard's events and the node's.
func (n *Node) ExecShard(id int, line string) error {
	s, err := n.shard(id)
	if err != nil {
		return err
	}
	c, err := ParseShardCommand(line)
	if err == nil {
		c.Shards = []int{id}
		err = n.Apply(c)
	}
	if err != nil {
		n.reject(s, line, err)
	}
	return err
}

// maxLoggedCommand is how much of a refused command its events line shows:
// enough to recognise it, never a 64 KiB write copied into every log.
const maxLoggedCommand = 128

// clip shortens s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// reject logs a refused command, clipped, with the reason.
func (n *Node) reject(s *shard, line string, err error) {
	id := -1
	if s != nil {
		id = s.id
	}
	now := n.clock.Now()
	e := newEventLine(now, id, "rejected", slog.LevelWarn, n.log).str("cmd", clip(line, maxLoggedCommand)).err(err)
	b := e.finish(n.log)
	if s != nil {
		s.events.Append(b, now)
	}
	n.events.Append(b, now)
	e.release()
}

// Apply applies a parsed command. Named shards must all exist and the
// command must apply to each of them, or nothing is done; with All, shards
// the command does not apply to are skipped.
func (n *Node) Apply(c Command) error {
	if n.closed.Load() {
		return fmt.Errorf("%w: the node is shutting down", ErrBusy)
	}
	targets := n.order
	if !c.All {
		targets = make([]*shard, 0, len(c.Shards))
		for _, id := range c.Shards {
			s, err := n.shard(id)
			if err != nil {
				return &CommandError{Word: fmt.Sprint(id), Reason: "no such shard in this node's plan", Usage: NodeUsage, Err: ErrUnknownShard}
			}
			targets = append(targets, s)
		}
		if len(targets) == 0 {
			return &CommandError{Word: c.Verb.String(), Reason: "no shard named", Usage: NodeUsage, Err: ErrUsage}
		}
	}
	if c.Verb == VerbLease {
		return n.applyLease(c, targets)
	}
	if !c.All {
		for _, s := range targets {
			if err := s.check(c.Verb); err != nil && err != errNoop {
				return err
			}
		}
	}
	for _, s := range targets {
		s.apply(c.Verb)
	}
	return nil
}

func (n *Node) applyLease(c Command, targets []*shard) error {
	if n.lease == nil {
		return fmt.Errorf("%w: lease commands are not available", ErrNoLease)
	}
	// One lease command at a time, from the backend's answer to the
	// shards: two writers racing would otherwise leave shards holding the
	// grant the backend replaced.
	n.leaseMu.Lock()
	defer n.leaseMu.Unlock()
	ids := make([]int, len(targets))
	for i, s := range targets {
		ids[i] = s.id
	}
	var grants []LeaseGrant
	var err error
	if c.LeaseOff {
		grants, err = n.lease.Off(ids)
	} else {
		grants, err = n.lease.Arm(ids, c.Lease)
	}
	if err != nil {
		return err
	}
	for _, g := range grants {
		n.SetLease(g)
	}
	return nil
}

// SetLease applies a lease grant to its shard: a lease whose deadline has
// passed stops the shard, and a valid or disabled lease restarts the shard
// if an expiry stopped it. Grants for unknown shards are ignored.
func (n *Node) SetLease(g LeaseGrant) {
	if s := n.shards[g.Shard]; s != nil {
		s.setLease(g)
	}
}

// Send queues an operator command for a READY shard. The payload must be a
// JSON object with an op the supervisor does not reserve (heartbeat 1,
// identify 2, resume 6), at most MaxPayload bytes. It goes out at once when
// the shard's budget allows, or waits in a bounded queue. A refused command
// is logged to the shard's events and the node's.
func (n *Node) Send(id int, payload []byte) error {
	s, err := n.shard(id)
	if err != nil {
		return err
	}
	if err := n.checkAndSend(s, payload); err != nil {
		n.reject(s, "send "+string(payload[:min(len(payload), 2*maxLoggedCommand)]), err)
		return err
	}
	return nil
}

func (n *Node) checkAndSend(s *shard, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("%w: %d bytes; the gateway takes at most %d", ErrTooLarge, len(payload), MaxPayload)
	}
	// The gateway client's own reader: a check that read the op
	// differently (encoding/json folds case and keeps the last duplicate)
	// could be walked around with {"op":2,"Op":3}.
	env, err := wire.Read(payload)
	switch {
	case errors.Is(err, wire.ErrNoOp):
		return fmt.Errorf("%w: the command has no op, or one that is not an integer", ErrUsage)
	case errors.Is(err, wire.ErrAmbiguousOp):
		return fmt.Errorf("%w: the command has more than one op key, or one in another case", ErrUsage)
	case err != nil:
		return fmt.Errorf("%w: not a JSON object: %v", ErrUsage, err)
	case env.Op == 1 || env.Op == 2 || env.Op == 6:
		return fmt.Errorf("%w: op %d is sent by the supervisor only", ErrUsage, env.Op)
	}
	return s.sendCommand(payload)
}
