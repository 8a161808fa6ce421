package core_test

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/lease/local"
)

// pacerModel is the pacer written the slow and obvious way: a list of live
// requests, searched and filtered on every step. Without a start limit the
// Discord buckets are independent, so the time of every grant is decided by
// the requests alone, whatever order the timers fire in.
type pacerModel struct {
	discord bool
	mc      int
	next    map[int]time.Time // Discord: earliest next identify per key
	recent  []time.Time       // Fluxer: every identify so far
	pol     core.FluxerPacing
	live    []modelRequest // in request order
}

type modelRequest struct{ id, shard int }

type pacerGrant struct {
	id int
	at time.Time
}

func (m *pacerModel) key(shard int) int {
	if m.discord {
		return shard % m.mc
	}
	return 0
}

// allowAt is the earliest time, not before now, at which key may identify.
func (m *pacerModel) allowAt(key int, now time.Time) time.Time {
	if m.discord {
		return later(now, m.next[key])
	}
	t := now
	if n := len(m.recent); n > 0 {
		t = later(t, m.recent[n-1].Add(m.pol.Spacing))
	}
	for {
		var inWindow []time.Time
		for _, r := range m.recent {
			if r.Add(m.pol.Window).After(t) {
				inWindow = append(inWindow, r)
			}
		}
		if len(inWindow) < m.pol.Budget {
			return t
		}
		t = inWindow[0].Add(m.pol.Window)
	}
}

func (m *pacerModel) take(key int, now time.Time) {
	if m.discord {
		m.next[key] = now.Add(core.DiscordWindow)
		return
	}
	m.recent = append(m.recent, now)
}

// head returns the index in live of key's oldest request, or -1.
func (m *pacerModel) head(key int) int {
	return slices.IndexFunc(m.live, func(r modelRequest) bool { return m.key(r.shard) == key })
}

func (m *pacerModel) request(r modelRequest, now time.Time) bool {
	k := m.key(r.shard)
	if m.head(k) < 0 && !m.allowAt(k, now).After(now) {
		m.take(k, now)
		return true
	}
	m.live = append(m.live, r)
	return false
}

// advance grants, up to end, every request whose key allows it, oldest of
// its key first.
func (m *pacerModel) advance(now, end time.Time) []pacerGrant {
	var grants []pacerGrant
	for {
		best, bestAt := -1, time.Time{}
		for i, r := range m.live {
			k := m.key(r.shard)
			if m.head(k) != i {
				continue
			}
			if at := m.allowAt(k, now); best < 0 || at.Before(bestAt) {
				best, bestAt = i, at
			}
		}
		if best < 0 || bestAt.After(end) {
			return grants
		}
		now = bestAt
		r := m.live[best]
		m.take(m.key(r.shard), now)
		m.live = slices.Delete(m.live, best, best+1)
		grants = append(grants, pacerGrant{r.id, now})
	}
}

func (m *pacerModel) cancel(id int) {
	m.live = slices.DeleteFunc(m.live, func(r modelRequest) bool { return r.id == id })
}

// waiting is what Pacer.Waiting should say.
func (m *pacerModel) waiting(now time.Time) (int, time.Time) {
	var next time.Time
	for i, r := range m.live {
		k := m.key(r.shard)
		if m.head(k) != i {
			continue
		}
		if at := m.allowAt(k, now); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return len(m.live), next
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestPropertyPacer checks the pacer against pacerModel through random
// requests, cancels (of waiting, granted and already cancelled requests),
// clock advances and, for Discord, changes of max_concurrency: the same
// requests are granted at the same times, none twice, none after its
// cancel, and Waiting agrees.
func TestPropertyPacer(t *testing.T) {
	for _, discord := range []bool{true, false} {
		name := "Fluxer"
		if discord {
			name = "Discord"
		}
		t.Run(name, func(t *testing.T) { rapid.Check(t, func(rt *rapid.T) { checkPacer(rt, discord) }) })
	}
}

func checkPacer(rt *rapid.T, discord bool) {
	clk := clock.NewFake()
	m := &pacerModel{discord: discord, next: map[int]time.Time{}}
	var p *core.Pacer
	if discord {
		m.mc = rapid.IntRange(1, 4).Draw(rt, "max_concurrency")
		p = core.NewDiscordPacer(clk, m.mc)
	} else {
		m.pol = core.FluxerPacing{
			Budget:  rapid.IntRange(1, 4).Draw(rt, "budget"),
			Window:  time.Duration(rapid.IntRange(1, 30).Draw(rt, "window")) * time.Second,
			Spacing: time.Duration(rapid.IntRange(0, 3).Draw(rt, "spacing")) * time.Second,
		}
		p = core.NewFluxerPacer(clk, m.pol)
	}
	var (
		got, want []pacerGrant
		cancels   []func()
		ids       int
		done      = map[int]string{} // id -> "granted" or "cancelled"
	)
	rt.Repeat(map[string]func(*rapid.T){
		"request": func(t *rapid.T) {
			id := ids
			ids++
			shard := rapid.IntRange(0, 11).Draw(t, "shard")
			now, cancel := p.Request(shard, false, func() {
				if done[id] != "" {
					t.Fatalf("request %d granted after it was %s", id, done[id])
				}
				done[id] = "granted"
				got = append(got, pacerGrant{id, clk.Now()})
			})
			cancels = append(cancels, cancel)
			if wantNow := m.request(modelRequest{id, shard}, clk.Now()); now != wantNow {
				t.Fatalf("Request(%d) now = %v; the model says %v", shard, now, wantNow)
			}
			if now {
				done[id] = "granted"
				got = append(got, pacerGrant{id, clk.Now()})
				want = append(want, pacerGrant{id, clk.Now()})
			}
		},
		"cancel": func(t *rapid.T) {
			if len(cancels) == 0 {
				t.Skip("nothing requested")
			}
			id := rapid.IntRange(0, len(cancels)-1).Draw(t, "id")
			cancels[id]()
			m.cancel(id)
			if done[id] == "" {
				done[id] = "cancelled"
			}
		},
		"advance": func(t *rapid.T) {
			d := time.Duration(rapid.IntRange(0, 12_000).Draw(t, "ms")) * time.Millisecond
			want = append(want, m.advance(clk.Now(), clk.Now().Add(d))...)
			clk.Advance(d)
		},
		"max_concurrency": func(t *rapid.T) {
			if !discord {
				t.Skip("Fluxer has no buckets")
			}
			mc := rapid.IntRange(1, 4).Draw(t, "mc")
			p.SetStartLimit(core.StartLimit{MaxConcurrency: mc})
			if mc != m.mc {
				for k := range m.next {
					if k >= mc {
						delete(m.next, k)
					}
				}
				m.mc = mc
			}
		},
		"": func(t *rapid.T) {
			byTime := func(a, b pacerGrant) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.id, b.id)) }
			g, w := slices.SortedFunc(slices.Values(got), byTime), slices.SortedFunc(slices.Values(want), byTime)
			if !slices.Equal(g, w) {
				t.Fatalf("grants (id@time)\n got  %v\n want %v", fmtGrants(g), fmtGrants(w))
			}
			n, next := p.Waiting()
			wn, wnext := m.waiting(clk.Now())
			if n != wn || !next.Equal(wnext) {
				t.Fatalf("Waiting() = %d, %v; the model says %d, %v", n, next, wn, wnext)
			}
		},
	})
}

func fmtGrants(gs []pacerGrant) string {
	s := ""
	for _, g := range gs {
		s += fmt.Sprintf(" %d@%v", g.id, g.at.Sub(clock.Epoch))
	}
	return s
}

// requestN asks for n automatic slots for shard, one per Discord window,
// and returns how many were granted.
func requestN(clk *clock.Fake, p *core.Pacer, shard, n int, operator bool) (granted int) {
	for range n {
		if now, cancel := p.Request(shard, operator, func() { granted++ }); now {
			granted++
		} else {
			clk.Advance(core.DiscordWindow)
			cancel()
		}
		clk.Advance(core.DiscordWindow)
	}
	return granted
}

// The reserve: automatic requests leave the last starts (1% of the total,
// at least 1) to the operator, who may spend them, and nobody more.
func TestPacerReserve(t *testing.T) {
	for _, tc := range []struct {
		total, reserve, want int
	}{
		{5, -1, 1}, {1000, -1, 10}, {250, -1, 2}, {1, -1, 0}, {5, 0, 0}, {5, 3, 3},
	} {
		clk := clock.NewFake()
		p := core.NewDiscordPacer(clk, 1)
		p.SetReserve(tc.reserve)
		p.SetStartLimit(core.StartLimit{Total: tc.total, Remaining: tc.total, ResetAfter: 24 * time.Hour, MaxConcurrency: 1})
		if b := p.Budget(); b.Reserve != tc.want {
			t.Errorf("total %d, --identify-reserve %d: reserve %d; want %d", tc.total, tc.reserve, b.Reserve, tc.want)
		}
		if got := requestN(clk, p, 0, tc.total+3, false); got != tc.total-tc.want {
			t.Errorf("total %d, reserve %d: %d automatic identifies; want %d", tc.total, tc.want, got, tc.total-tc.want)
		}
		if got := requestN(clk, p, 0, tc.total+3, true); got != tc.want {
			t.Errorf("total %d, reserve %d: the operator got %d; want the reserve, %d", tc.total, tc.want, got, tc.want)
		}
		if b := p.Budget(); b.Remaining != 0 || b.Used24h != tc.total {
			t.Errorf("total %d: remaining %d, used_24h %d; want 0, %d", tc.total, b.Remaining, b.Used24h, tc.total)
		}
	}
}

// An operator's request goes ahead of the automatic ones held back by the
// reserve, and BudgetWait says until when each kind waits.
func TestPacerOperatorAhead(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	p.SetStartLimit(core.StartLimit{Total: 5, Remaining: 1, ResetAfter: time.Hour, MaxConcurrency: 1})
	var order []int
	for _, shard := range []int{1, 2} {
		if now, _ := p.Request(shard, false, func() { order = append(order, shard) }); now {
			t.Fatalf("shard %d granted the reserve automatically", shard)
		}
	}
	reset := clock.Epoch.Add(time.Hour)
	if at := p.BudgetWait(false); !at.Equal(reset) {
		t.Errorf("BudgetWait(automatic) = %v; want the reset, %v", at, reset)
	}
	if at := p.BudgetWait(true); !at.IsZero() {
		t.Errorf("BudgetWait(operator) = %v with one start left; want zero", at)
	}
	if now, _ := p.Request(3, true, func() { order = append(order, 3) }); !now {
		t.Fatal("the operator's request waited behind automatic ones held by the reserve")
	}
	if at := p.BudgetWait(true); !at.Equal(reset) {
		t.Errorf("BudgetWait(operator) = %v with none left; want %v", at, reset)
	}
	// Nothing left: the operator waits too, ahead of the others.
	p.Request(4, true, func() { order = append(order, 4) })
	clk.Advance(time.Hour - time.Millisecond)
	if len(order) != 0 {
		t.Fatalf("granted %v before the reset", order)
	}
	clk.Advance(time.Minute)
	if got := fmt.Sprint(order); got != "[4 1 2]" {
		t.Errorf("after the reset the waiting requests were granted as %s; want [4 1 2]", got)
	}
}

// Remaining is raised only when the clock reaches the reset time: not by
// an answer with a higher remaining, nor by one with an earlier reset; an
// answer may lower it.
func TestPacerNeverRaisedBeforeReset(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	p.SetReserve(0)
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 4, ResetAfter: time.Hour, MaxConcurrency: 1})
	if got := requestN(clk, p, 0, 2, false); got != 2 {
		t.Fatalf("granted %d of 2", got)
	}
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 10, ResetAfter: time.Minute, MaxConcurrency: 1})
	if b := p.Budget(); b.Remaining != 2 || !b.ResetAt.Equal(clock.Epoch.Add(time.Hour)) {
		t.Fatalf("after a lagging answer: remaining %d, reset_at %v; want 2, %v", b.Remaining, b.ResetAt, clock.Epoch.Add(time.Hour))
	}
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 1, ResetAfter: time.Hour, MaxConcurrency: 1})
	if b := p.Budget(); b.Remaining != 1 {
		t.Fatalf("an answer with remaining 1 left %d", b.Remaining)
	}
	if got := requestN(clk, p, 0, 5, false); got != 1 {
		t.Fatalf("granted %d with 1 left; want 1", got)
	}
	clk.Advance(time.Hour - clk.Now().Sub(clock.Epoch) - time.Millisecond)
	if b := p.Budget(); b.Remaining != 0 {
		t.Fatalf("a millisecond before the reset: remaining %d; want 0", b.Remaining)
	}
	clk.Advance(time.Millisecond)
	if b := p.Budget(); b.Remaining != 10 || !b.ResetAt.IsZero() {
		t.Fatalf("at the reset: remaining %d, reset_at %v; want 10, unknown until the next grant", b.Remaining, b.ResetAt)
	}
	requestN(clk, p, 0, 1, false)
	// The gateway's period starts when that identify arrives: a minute's
	// margin.
	if b := p.Budget(); b.Remaining != 9 || !b.ResetAt.Equal(clock.Epoch.Add(time.Hour).Add(core.DiscordStartPeriod+time.Minute)) {
		t.Fatalf("after the first grant of the period: remaining %d, reset_at %v", b.Remaining, b.ResetAt)
	}
}

// The first answer counts less the slots granted before it (a
// connection discovers after its slot); LimitTotal, for --gateway, does
// the same with Discord's documented total.
func TestPacerFirstFigureLessGrants(t *testing.T) {
	for _, tc := range []struct {
		remaining, want int
		reset           time.Duration
	}{
		// Nothing counted yet: the period starts as ours arrive, within
		// a minute.
		{1000, 998, 24*time.Hour + time.Minute},
		// The gateway's period has begun: its reset_after holds.
		{999, 997, 2 * time.Hour},
	} {
		clk := clock.NewFake()
		p := core.NewDiscordPacer(clk, 2)
		requestN(clk, p, 0, 1, false)
		requestN(clk, p, 1, 1, false)
		p.SetStartLimit(core.StartLimit{Total: 1000, Remaining: tc.remaining, ResetAfter: 2 * time.Hour, MaxConcurrency: 2})
		if b := p.Budget(); b.Total != 1000 || b.Remaining != tc.want || !b.ResetAt.Equal(clk.Now().Add(tc.reset)) {
			t.Errorf("first answer (remaining %d) after 2 grants: %+v; want remaining %d, reset in %v", tc.remaining, b, tc.want, tc.reset)
		}
	}

	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	if b := p.Budget(); b.Total != 0 {
		t.Fatalf("a new pacer knows a total: %+v", b)
	}
	requestN(clk, p, 0, 3, false)
	p.LimitTotal(core.DiscordStartTotal)
	if b := p.Budget(); b.Total != 1000 || b.Remaining != 997 || b.ResetAt.IsZero() || b.Used24h != 3 {
		t.Errorf("--gateway after 3 grants: %+v; want total 1000, remaining 997, a reset time, used_24h 3", b)
	}
	// --identify-total caps what discovery says.
	p.SetStartLimit(core.StartLimit{Total: 5000, Remaining: 5000, ResetAfter: time.Hour, MaxConcurrency: 1})
	if b := p.Budget(); b.Total != 1000 || b.Remaining != 997 {
		t.Errorf("an answer above the limit: %+v; want total 1000, remaining 997", b)
	}
}

// event=identify-budget at 50% and 80% used and at the reserve, once each
// per reset period.
func TestPacerBudgetNotes(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	var notes []string
	p.SetBudgetNotify(func(n core.BudgetNote) {
		notes = append(notes, fmt.Sprintf("%s@%d/%d", n.Mark, n.Used, n.Total))
	})
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 10, ResetAfter: time.Hour, MaxConcurrency: 1})
	requestN(clk, p, 0, 12, false)
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 0, ResetAfter: time.Hour, MaxConcurrency: 1})
	want := "[50%@5/10 80%@8/10 reserve@9/10]"
	if got := fmt.Sprint(notes); got != want {
		t.Fatalf("notes %s; want %s", got, want)
	}
	clk.Advance(p.Budget().ResetAt.Sub(clk.Now()))
	notes = nil
	requestN(clk, p, 0, 5, false)
	if got := fmt.Sprint(notes); got != "[50%@5/10]" {
		t.Errorf("next period: notes %s; want [50%%@5/10]", got)
	}
}

// Fluxer's /identify figures are its window.
func TestPacerFluxerBudget(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewFluxerPacer(clk, core.FluxerPacing{Budget: 3, Window: time.Minute})
	for range 3 {
		p.Request(0, false, func() {})
		clk.Advance(10 * time.Second)
	}
	p.Request(1, false, func() {})
	b := p.Budget()
	if b.Total != 3 || b.Remaining != 0 || !b.ResetAt.Equal(clock.Epoch.Add(time.Minute)) || b.Waiting != 1 || b.Used24h != 3 || b.Reserve != 0 {
		t.Errorf("Budget() = %+v; want total 3, remaining 0, reset at +1m, 1 waiting, used 3, no reserve", b)
	}
	if at := p.BudgetWait(false); !at.Equal(clock.Epoch.Add(time.Minute)) {
		t.Errorf("BudgetWait = %v; want +1m", at)
	}
}

// The issue-11 overspend: a connection's own discovery runs after its
// identify slot was granted, before the identify reached the gateway, so
// the answer counts none of the identifies in flight. Raising remaining
// from such an answer let the node spend more than session_start_limit.
func TestPacerLaggingAnswerNeverRaises(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	lag := core.StartLimit{Total: 5, Remaining: 5, ResetAfter: 24 * time.Hour, MaxConcurrency: 1}
	granted := 0
	for i := range 20 {
		if now, _ := p.Request(0, false, func() { granted++ }); now {
			granted++
		}
		if i%3 == 0 {
			// Every rediscovery answers as if none of ours was sent.
			p.SetStartLimit(lag)
		}
		clk.Advance(core.DiscordWindow)
	}
	// 5 starts, the last one the operator's reserve.
	if granted != 4 {
		t.Fatalf("%d automatic identifies granted with session_start_limit.total 5; want 4 (the last start is the reserve)", granted)
	}
}

// A shard held back by the budget says so in its diag (phase
// wait-identify-budget, identify_wait_until), the node's events carry the
// identify-budget lines, an operator's identify may spend the reserve and
// retry too.
func TestShardWaitsForBudget(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 4)
	p.SetStartLimit(core.StartLimit{Total: 4, Remaining: 4, ResetAfter: time.Hour, MaxConcurrency: 4})
	e2 := &env{t: t, clk: clk, tr: &coretest.Transport{}, lease: local.New(clk)}
	node, err := core.New(core.Config{
		Plan: core.Range(4, 0, 3), Transport: e2.tr, Clock: clk, Lease: e2.lease, Pacer: p,
		Backoff: core.Fixed(5 * time.Second), Rand: func() float64 { return 0.5 },
	})
	if err != nil {
		t.Fatal(err)
	}
	e2.node = node
	t.Cleanup(node.Close)
	e2.node.Start() // shards 0-2 identify; shard 3 meets the reserve
	for id := range 3 {
		e2.ready(id, 1)
	}
	d := e2.diag(3)
	// Nothing was used when discovery answered: the period began with
	// the first identify, give or take the minute it takes to arrive.
	reset := clock.Epoch.Add(24*time.Hour + time.Minute)
	if d.Phase.String() != "wait-identify-budget" || !d.IdentifyWaitUntil.Equal(reset) {
		t.Fatalf("shard 3: phase %s until %v; want wait-identify-budget until %v", d.Phase, d.IdentifyWaitUntil, reset)
	}
	text := string(d.AppendText(nil, clk.Now()))
	if !strings.Contains(text, "phase wait-identify-budget\nidentify_wait_until 2026-12-01T07:01:00Z\n") {
		t.Errorf("shard 3's diag:\n%s", text)
	}
	if d := e2.diag(0); d.Phase.String() != "ready" || !d.IdentifyWaitUntil.IsZero() {
		t.Errorf("shard 0: phase %s, wait until %v", d.Phase, d.IdentifyWaitUntil)
	}
	buf := make([]byte, e2.node.Events().Size())
	n, _ := e2.node.Events().ReadAt(buf, 0)
	nodeEvents := string(buf[:n])
	if !strings.Contains(nodeEvents, "shard=1 event=identify-budget mark=50% used=2 total=4 remaining=2 reset_at=2026-12-01T07:01:00Z\n") ||
		!strings.Contains(nodeEvents, "shard=2 event=identify-budget mark=reserve used=3 total=4 remaining=1 reset_at=2026-12-01T07:01:00Z\n") {
		t.Errorf("node events lack the identify-budget lines:\n%s", nodeEvents)
	}
	if !strings.Contains(e2.events(2), "event=identify-budget mark=reserve") {
		t.Errorf("shard 2's events lack the reserve line:\n%s", e2.events(2))
	}

	// The operator's identify on shard 3 spends the reserve.
	e2.exec(3, "identify")
	if d := e2.diag(3); d.Phase != core.PhaseDial {
		t.Fatalf("after the operator's identify shard 3 is in phase %s; want dial", d.Phase)
	}
	e2.ready(3, 1)
	if !strings.Contains(e2.events(3), "event=identify-budget mark=80% used=4 total=4 remaining=0") {
		t.Errorf("shard 3's events lack the 80%% line:\n%s", e2.events(3))
	}
	// A FATAL shard's retry may spend it too, but none is left now.
	e2.conn(0).Link.Fail(core.Failure{Class: core.FatalFailure, Err: errors.New("4004"), Code: 4004})
	e2.exec(0, "retry")
	if d := e2.diag(0); d.Phase.String() != "wait-identify-budget" {
		t.Fatalf("retry with no start left: phase %s", d.Phase)
	}
	clk.Advance(reset.Sub(clk.Now()))
	if d := e2.diag(0); d.Phase != core.PhaseDial {
		t.Fatalf("retry after the reset: phase %s; want dial", d.Phase)
	}
}

// A slot granted within a minute of the reset may reach the gateway after
// its reset, and count in its new period: it counts in ours too.
func TestPacerGrantNearResetCountsAfter(t *testing.T) {
	clk := clock.NewFake()
	p := core.NewDiscordPacer(clk, 1)
	p.SetReserve(0)
	p.SetStartLimit(core.StartLimit{Total: 10, Remaining: 5, ResetAfter: time.Hour, MaxConcurrency: 1})
	clk.Advance(time.Hour - 2*time.Minute)
	p.Request(0, false, func() {}) // two minutes before: the old period's
	clk.Advance(90 * time.Second)
	p.Request(0, false, func() {}) // 30 s before
	clk.Advance(30 * time.Second)
	b := p.Budget()
	if want := clock.Epoch.Add(time.Hour - 30*time.Second + 24*time.Hour + time.Minute); b.Remaining != 9 || !b.ResetAt.Equal(want) {
		t.Errorf("after the reset: remaining %d, reset_at %v; want 9, %v", b.Remaining, b.ResetAt, want)
	}
}

// gatewayBudget is Discord's side of session_start_limit as the
// simulator keeps it: the period starts with the first identify it
// counts, an identify counts when it arrives, and one over the total
// resets the token.
type gatewayBudget struct {
	total    int
	start    time.Time // zero: no period running
	used     int
	arrivals []time.Time // identifies in flight, by arrival time
	over     string
}

func (g *gatewayBudget) send(at time.Time, n int) {
	// Dial, TLS and Hello take up to 50 s, less than the pacer's minute.
	delay := time.Duration(n*7919%51) * time.Second
	g.arrivals = append(g.arrivals, at.Add(delay))
	slices.SortFunc(g.arrivals, func(a, b time.Time) int { return a.Compare(b) })
}

func (g *gatewayBudget) arrive(now time.Time) {
	for len(g.arrivals) > 0 && !g.arrivals[0].After(now) {
		a := g.arrivals[0]
		g.arrivals = g.arrivals[1:]
		if !g.start.IsZero() && !a.Before(g.start.Add(core.DiscordStartPeriod)) {
			g.start, g.used = time.Time{}, 0
		}
		if g.start.IsZero() {
			g.start = a
		}
		if g.used >= g.total && g.over == "" {
			g.over = fmt.Sprintf("identify %d of a total of %d arrived at %v, in the period from %v", g.used+1, g.total, a.Sub(clock.Epoch), g.start.Sub(clock.Epoch))
		}
		g.used++
	}
}

func (g *gatewayBudget) answer(now time.Time) core.StartLimit {
	g.arrive(now)
	l := core.StartLimit{Total: g.total, Remaining: g.total, ResetAfter: core.DiscordStartPeriod, MaxConcurrency: 1}
	if !g.start.IsZero() && now.Before(g.start.Add(core.DiscordStartPeriod)) {
		l.Remaining, l.ResetAfter = g.total-g.used, g.start.Add(core.DiscordStartPeriod).Sub(now)
	}
	return l
}

// Whatever the order of requests (automatic or the operator's), cancels,
// discovery answers (which lag the identifies in flight) and clock
// advances across periods, the gateway never counts an identify beyond
// its total.
func TestPropertyBudgetNeverExceeded(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		clk := clock.NewFake()
		g := &gatewayBudget{total: rapid.IntRange(1, 8).Draw(rt, "total")}
		p := core.NewDiscordPacer(clk, 1)
		sent := 0
		grant := func() { sent++; g.send(clk.Now(), sent) }
		// Until a total is known the pacer enforces nothing: serve
		// discovers before it starts the shards, or with --gateway takes
		// the documented total.
		if rapid.Bool().Draw(rt, "--gateway") {
			p.LimitTotal(g.total)
		} else {
			p.SetStartLimit(g.answer(clk.Now()))
		}
		var cancels []func()
		rt.Repeat(map[string]func(*rapid.T){
			"request": func(t *rapid.T) {
				now, cancel := p.Request(rapid.IntRange(0, 3).Draw(t, "shard"), rapid.Bool().Draw(t, "operator"), grant)
				if now {
					grant()
				}
				cancels = append(cancels, cancel)
			},
			"cancel": func(t *rapid.T) {
				if len(cancels) == 0 {
					t.Skip("nothing requested")
				}
				cancels[rapid.IntRange(0, len(cancels)-1).Draw(t, "i")]()
			},
			"discover": func(t *rapid.T) { p.SetStartLimit(g.answer(clk.Now())) },
			"advance": func(t *rapid.T) {
				d := time.Duration(rapid.Int64Range(0, int64(30*time.Hour)).Draw(t, "d"))
				if rapid.Bool().Draw(t, "short") {
					d = time.Duration(rapid.IntRange(0, 120).Draw(t, "s")) * time.Second
				}
				clk.Advance(d)
			},
			"": func(t *rapid.T) {
				g.arrive(clk.Now())
				if g.over != "" {
					t.Fatal(g.over)
				}
			},
		})
		clk.Advance(time.Hour) // every identify in flight arrives
		g.arrive(clk.Now())
		if g.over != "" {
			rt.Fatal(g.over)
		}
	})
}
