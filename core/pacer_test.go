package core_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
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
