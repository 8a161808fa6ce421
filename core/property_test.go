package core_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/lease/local"
)

// model is what the test knows about a shard from the events it fed the
// core: enough to predict the resume rule independently of the core.
type model struct {
	sessExists, sessValid bool
	seq                   int64
	seqValid              bool
	resuming              bool // the live connection was opened to resume
	failedResumes         int  // resumes in a row that failed after Resume went out
	// What the test expects from the inputs alone.
	reconnects    uint64    // entries into BACKOFF the inputs caused
	leaseDeadline time.Time // from the lease commands that succeeded
}

func (m *model) resumable() bool { return m.sessExists && m.sessValid && m.seqValid }

// grant is one identify slot the pacer handed out.
type grant struct {
	shard int
	at    time.Time
}

// checkedPacer wraps the real pacer, checks that no resumable shard ever
// asks for a slot, and records every grant.
type checkedPacer struct {
	inner  *core.Pacer
	clk    *clock.Fake
	models map[int]*model
	grants []grant
	fail   func(string, ...any)
}

func (p *checkedPacer) BudgetWait(op bool) time.Time { return p.inner.BudgetWait(op) }

func (p *checkedPacer) Request(shard int, op bool, g func()) (bool, func()) {
	if p.models[shard].resumable() {
		p.fail("shard %d asked for an identify slot while resumable", shard)
	}
	now, cancel := p.inner.Request(shard, op, func() {
		p.grants = append(p.grants, grant{shard, p.clk.Now()})
		g()
	})
	if now {
		p.grants = append(p.grants, grant{shard, p.clk.Now()})
	}
	return now, cancel
}

const (
	propShards = 9
	propTotal  = 12
	propMC     = 3
)

// Fluxer's budget in the property test: small, so that it binds.
var propFluxer = core.FluxerPacing{Budget: 3, Window: 30 * time.Second, Spacing: time.Second}

// The Discord start limit in the property test: six identifies in the first
// 20 minutes.
var propLimit = core.StartLimit{Total: 1000, Remaining: 6, ResetAfter: 20 * time.Minute, MaxConcurrency: propMC}

// TestPropertyLifecycle feeds random interleavings of transport events,
// operator commands and clock advances to a node of 9 shards, for each
// flavor's pacer, and checks the lifecycle invariants after every step,
// among them that every state change is a move the lifecycle table lists.
func TestPropertyLifecycle(t *testing.T) {
	for _, flavor := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(flavor.String(), func(t *testing.T) { rapid.Check(t, func(rt *rapid.T) { checkLifecycle(rt, flavor) }) })
	}
}

func checkLifecycle(rt *rapid.T, flavor core.Flavor) {
	{
		clk := clock.NewFake()
		models := map[int]*model{}
		local := []int{0, 1, 2, 4, 5, 7, 8, 10, 11}
		for _, id := range local {
			models[id] = &model{}
		}
		inner := core.NewDiscordPacer(clk, 1)
		inner.SetStartLimit(propLimit)
		if flavor == core.Fluxer {
			inner = core.NewFluxerPacer(clk, propFluxer)
		}
		pacer := &checkedPacer{inner: inner, clk: clk, models: models, fail: rt.Fatalf}
		tr := &coretest.Transport{}
		tr.Probe = func(a core.Attempt) {
			m := models[a.Shard]
			m.resuming = a.Resume
			switch {
			case a.Resume && !m.resumable():
				rt.Fatalf("shard %d resumed but its session or sequence is not valid (%+v)", a.Shard, *m)
			case a.Resume && a.Sequence != m.seq:
				rt.Fatalf("shard %d resumed at %d; its sequence was %d", a.Shard, a.Sequence, m.seq)
			case !a.Resume && m.resumable():
				rt.Fatalf("shard %d identified though resumable (%+v)", a.Shard, *m)
			case !a.Resume:
				m.seqValid = false
			}
		}
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1))
		node, err := core.New(core.Config{
			Plan: core.Plan{Total: propTotal, Local: local}, Flavor: flavor, Transport: tr, Clock: clk,
			Pacer: pacer, Lease: local2(clk), Backoff: core.DefaultBackoff, Rand: rng.Float64,
			EventRetention: 1 << 22, NodeEventRetention: 1 << 22,
		})
		if err != nil {
			rt.Fatal(err)
		}
		defer node.Close()
		var moves moveLog
		watchMoves(node, &moves)
		node.Start()

		current := func(id int) *coretest.Conn {
			c := tr.Last(id)
			if c == nil || len(c.Closed()) > 0 {
				return nil
			}
			return c
		}
		prev := node.Snapshot(nil)
		retried := map[int]bool{}
		newSession := map[int]bool{}
		epochs := map[uint64]int{} // every epoch handed out, and to whom
		closed, closedConns := false, 0

		// transientFail updates the model for a transient failure of a
		// live connection: a resume that failed after its Resume went out
		// counts towards giving the session up.
		transientFail := func(id int) {
			m := models[id]
			if d, _ := node.Diag(id); d.State == core.Starting && m.resuming && d.Phase == core.PhaseResume {
				if m.failedResumes++; m.failedResumes >= core.MaxFailedResumes {
					m.failedResumes, m.sessValid = 0, false
				}
			}
		}

		// shardEvent runs f against one shard's connection (current or
		// stale) and checks that no other shard changed.
		shardEvent := func(t *rapid.T, name string, f func(id int, c *coretest.Conn, live bool)) {
			id := rapid.SampledFrom(local).Draw(t, "shard")
			conns := tr.Conns()
			var c *coretest.Conn
			if cur := current(id); cur != nil && rapid.IntRange(0, 9).Draw(t, "stale") > 0 {
				c = cur
			} else {
				for _, old := range conns {
					if old.Attempt.Shard == id && rapid.Bool().Draw(t, "pick") {
						c = old
					}
				}
			}
			if c == nil {
				return
			}
			before := node.Snapshot(nil)
			f(id, c, c == current(id))
			after := node.Snapshot(nil)
			for i := range after {
				if after[i].Shard != id && !reflect.DeepEqual(before[i], after[i]) {
					t.Fatalf("%s on shard %d changed shard %d:\nbefore %+v\nafter  %+v", name, id, after[i].Shard, before[i], after[i])
				}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"ready": func(t *rapid.T) {
				shardEvent(t, "ready", func(id int, c *coretest.Conn, live bool) {
					seq := rapid.Int64Range(1, 5).Draw(t, "seq")
					if live {
						m := models[id]
						m.sessExists, m.sessValid, m.seq, m.seqValid = true, true, seq, true
						m.failedResumes = 0
						newSession[id] = true
					}
					c.Link.Ready(core.Session{ID: secretSession}, seq)
				})
			},
			"resumed": func(t *rapid.T) {
				shardEvent(t, "resumed", func(id int, c *coretest.Conn, live bool) {
					seq := models[id].seq + 1
					if live && models[id].resuming {
						models[id].failedResumes = 0
					}
					if d, _ := node.Diag(id); live && models[id].resuming && (d.State == core.Ready || d.State == core.Starting && d.Phase != core.PhaseWaitSlot && d.Phase != core.PhaseIdentify) {
						models[id].seq, models[id].seqValid = seq, true
					}
					c.Link.Resumed(seq)
				})
			},
			"dispatch": func(t *rapid.T) {
				shardEvent(t, "dispatch", func(id int, c *coretest.Conn, live bool) {
					seq := models[id].seq + rapid.Int64Range(1, 3).Draw(t, "step")
					if d, _ := node.Diag(id); live && (d.State == core.Ready || d.State == core.Starting && models[id].resuming && d.Phase != core.PhaseWaitSlot && d.Phase != core.PhaseIdentify) {
						models[id].seq, models[id].seqValid = seq, true
					}
					c.Link.Dispatch(seq)
				})
			},
			"heartbeat": func(t *rapid.T) {
				shardEvent(t, "heartbeat", func(_ int, c *coretest.Conn, _ bool) {
					c.Link.Heartbeat(time.Duration(rapid.IntRange(1, 500).Draw(t, "ms")) * time.Millisecond)
					c.Link.Phase(rapid.SampledFrom([]core.Phase{core.PhaseHello, core.PhaseResume}).Draw(t, "phase"))
					c.Link.Transport(core.ConnState{TCP: core.LayerOK, WS: core.LayerOK})
				})
			},
			"fail": func(t *rapid.T) {
				shardEvent(t, "fail", func(id int, c *coretest.Conn, live bool) {
					class := rapid.SampledFrom([]core.FailureClass{core.Transient, core.NewSession, core.FatalFailure}).Draw(t, "class")
					var deadline time.Time
					if rapid.IntRange(0, 3).Draw(t, "op7") == 0 {
						deadline = clk.Now()
					}
					if live && class != core.Transient {
						models[id].sessValid = false
					}
					if live && class == core.Transient {
						transientFail(id)
					}
					if live && class != core.FatalFailure {
						models[id].reconnects++
					}
					c.Link.Fail(core.Failure{Class: class, Err: errDrop, Code: 4000, Deadline: deadline})
				})
			},
			"invalidated": func(t *rapid.T) {
				shardEvent(t, "invalidated", func(id int, c *coretest.Conn, live bool) {
					if live {
						models[id].sessValid, models[id].seqValid, models[id].resuming = false, false, false
					}
					c.Link.Invalidated()
				})
			},
			"panic": func(t *rapid.T) {
				shardEvent(t, "panic", func(id int, c *coretest.Conn, live bool) {
					if live {
						models[id].reconnects++
						transientFail(id)
					}
					func() {
						defer c.Link.Recover()
						panic("injected")
					}()
				})
			},
			"command": func(t *rapid.T) {
				verb := rapid.SampledFrom([]string{"reset", "stop", "start", "identify", "retry", "lease", "lease off", "frob"}).Draw(t, "verb")
				if verb == "lease" {
					verb = fmt.Sprintf("lease %ds", rapid.IntRange(1, 90).Draw(t, "lease"))
				}
				var targets []int
				var err error
				if rapid.Bool().Draw(t, "node") {
					line := verb
					if !strings.HasPrefix(verb, "lease") {
						if rapid.Bool().Draw(t, "all") {
							line += " all"
							targets = local
						} else {
							id := rapid.SampledFrom(local).Draw(t, "id")
							line += fmt.Sprint(" ", id)
							targets = []int{id}
						}
					}
					if verb == "identify" {
						for _, id := range targets {
							if s := prev[indexOf(local, id)].State; s == core.Starting || s == core.Ready || s == core.Backoff {
								models[id].sessValid = false
							}
						}
					}
					err = node.ExecNode(line)
				} else {
					id := rapid.SampledFrom(local).Draw(t, "id")
					targets = []int{id}
					if verb == "identify" {
						if s := prev[indexOf(local, id)].State; s == core.Starting || s == core.Ready || s == core.Backoff {
							models[id].sessValid = false
						}
					}
					err = node.ExecShard(id, verb)
				}
				if verb == "frob" && !errors.Is(err, core.ErrUsage) {
					t.Fatalf("frob accepted: %v", err)
				}
				if verb == "retry" && err == nil {
					for _, id := range targets {
						retried[id] = true
					}
				}
				if verb == "reset" && err == nil {
					for _, id := range targets {
						if s := prev[indexOf(local, id)].State; s == core.Starting || s == core.Ready || s == core.Backoff {
							models[id].reconnects++
						}
					}
				}
				if strings.HasPrefix(verb, "lease") && err == nil {
					if len(targets) == 0 {
						targets = local
					}
					var deadline time.Time
					if d, err := time.ParseDuration(strings.TrimPrefix(verb, "lease ")); err == nil {
						deadline = clk.Now().Add(d)
					}
					for _, id := range targets {
						models[id].leaseDeadline = deadline
					}
				}
			},
			// A lease grant the backend learnt of by itself (etcd).
			"grant": func(t *rapid.T) {
				id := rapid.SampledFrom(local).Draw(t, "id")
				var deadline time.Time
				if s := rapid.IntRange(0, 90).Draw(t, "grant"); s > 0 {
					deadline = clk.Now().Add(time.Duration(s) * time.Second)
				}
				d, _ := node.Diag(id)
				models[id].leaseDeadline = deadline
				node.SetLease(core.LeaseGrant{Shard: id, Deadline: deadline, Generation: d.Lease.Generation + uint64(rapid.IntRange(0, 1).Draw(t, "gen"))})
			},
			"close": func(t *rapid.T) {
				if closed || rapid.IntRange(0, 9).Draw(t, "close") > 0 {
					return
				}
				node.Close()
				closed, closedConns = true, len(tr.Conns())
			},
			"send": func(t *rapid.T) {
				node.Send(rapid.SampledFrom(local).Draw(t, "id"), []byte(`{"op":3,"d":{}}`))
			},
			"advance": func(t *rapid.T) {
				clk.Advance(time.Duration(rapid.IntRange(0, 120_000).Draw(t, "ms")) * time.Millisecond)
			},
			"": func(t *rapid.T) {
				moves.mu.Lock()
				unlisted := moves.unlisted
				moves.mu.Unlock()
				if len(unlisted) > 0 {
					t.Fatalf("moves the lifecycle table does not list: %v", unlisted)
				}
				now := clk.Now()
				cur := node.Snapshot(nil)
				for i, d := range cur {
					p, m := prev[i], models[d.Shard]
					if p.State == core.Fatal && d.State != core.Fatal && !retried[d.Shard] {
						t.Fatalf("shard %d left FATAL for %v without retry", d.Shard, d.State)
					}
					if d.SequenceValid && (!m.seqValid || d.Sequence != m.seq) {
						t.Fatalf("shard %d sequence %d; the events gave %d (valid=%v)", d.Shard, d.Sequence, m.seq, m.seqValid)
					}
					if d.Phase == core.PhaseWaitSlot {
						if d.SequenceValid {
							t.Fatalf("shard %d waits to identify with sequence %d", d.Shard, d.Sequence)
						}
						m.seqValid = false
					}
					backoffs := uint64(strings.Count(shardEvents(node, d.Shard), "event=backoff "))
					if d.Reconnects != m.reconnects || backoffs != m.reconnects {
						t.Fatalf("shard %d: reconnects %d and %d backoff lines after %d failures and resets", d.Shard, d.Reconnects, backoffs, m.reconnects)
					}
					if (d.State == core.Starting || d.State == core.Ready) && !m.leaseDeadline.IsZero() && !now.Before(m.leaseDeadline) {
						t.Fatalf("shard %d is %v with its lease expired at %v (now %v)", d.Shard, d.State, m.leaseDeadline, now)
					}
					switch d.State {
					case core.Starting, core.Ready, core.Backoff, core.Fatal:
						if d.Attempt < 1 {
							t.Fatalf("shard %d is %v at attempt %d; attempts count from 1", d.Shard, d.State, d.Attempt)
						}
					}
					if d.Attempt < p.Attempt {
						t.Fatalf("shard %d attempt went back from %d to %d", d.Shard, p.Attempt, d.Attempt)
					}
					if closed && (d.State == core.Starting || d.State == core.Ready) {
						t.Fatalf("shard %d is %v after Close", d.Shard, d.State)
					}
					if d.Epoch != p.Epoch {
						if other, ok := epochs[d.Epoch]; ok {
							t.Fatalf("shard %d got epoch %d, already shard %d's", d.Shard, d.Epoch, other)
						}
						epochs[d.Epoch] = d.Shard
					}
					switch {
					case d.Epoch < p.Epoch:
						t.Fatalf("shard %d epoch went back from %d to %d", d.Shard, p.Epoch, d.Epoch)
					case d.Epoch != p.Epoch && !newSession[d.Shard]:
						t.Fatalf("shard %d epoch changed without a new session", d.Shard)
					case d.Epoch == p.Epoch && newSession[d.Shard]:
						t.Fatalf("shard %d epoch unchanged by a new session", d.Shard)
					}
				}
				if n := len(tr.Conns()); closed && n > closedConns {
					t.Fatalf("%d connections after Close", n-closedConns)
				}
				checkGrants(t, flavor, pacer.grants)
				identifies, granted := map[int]int{}, map[int]int{}
				for _, c := range tr.Conns() {
					if !c.Attempt.Resume {
						identifies[c.Attempt.Shard]++
					}
					identifies[c.Attempt.Shard] += c.Identifies()
				}
				for _, g := range pacer.grants {
					granted[g.shard]++
				}
				for id, n := range identifies {
					if n > granted[id] {
						t.Fatalf("shard %d identified %d times with %d slots granted", id, n, granted[id])
					}
				}
				prev = cur
				clear(retried)
				clear(newSession)
			},
		})
	}
}

// checkGrants checks the identify slots against the flavor's limits:
// Discord, one per bucket per 5 s and no more than the start limit before
// its reset; Fluxer, Spacing apart and at most Budget in any Window.
func checkGrants(t *rapid.T, flavor core.Flavor, grants []grant) {
	if flavor == core.Fluxer {
		for i, g := range grants {
			if i > 0 && g.at.Sub(grants[i-1].at) < propFluxer.Spacing {
				t.Fatalf("identifies %v apart; the spacing is %v", g.at.Sub(grants[i-1].at), propFluxer.Spacing)
			}
			if j := i - propFluxer.Budget; j >= 0 && g.at.Sub(grants[j].at) < propFluxer.Window {
				t.Fatalf("%d identifies within %v", propFluxer.Budget+1, g.at.Sub(grants[j].at))
			}
		}
		return
	}
	last := map[int]time.Time{}
	early := 0
	for _, g := range grants {
		b := g.shard % propMC
		if at, ok := last[b]; ok && g.at.Sub(at) < core.DiscordWindow {
			t.Fatalf("bucket %d identified at %v and again %v later", b, at, g.at.Sub(at))
		}
		last[b] = g.at
		if g.at.Before(clock.Epoch.Add(propLimit.ResetAfter)) {
			early++
		}
	}
	if early > propLimit.Remaining {
		t.Fatalf("%d identifies before the start limit reset; %d remained", early, propLimit.Remaining)
	}
}

func local2(c *clock.Fake) *local.OperatorLease { return local.New(c) }

func indexOf(ids []int, id int) int {
	for i, v := range ids {
		if v == id {
			return i
		}
	}
	return -1
}

func shardEvents(n *core.Scheduler, id int) string {
	l, _ := n.ShardEvents(id)
	buf := make([]byte, l.Size())
	k, _ := l.ReadAt(buf, 0)
	return string(buf[:k])
}
