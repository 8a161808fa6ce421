package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
)

// gatedCheck is a confirmation check the test answers: each check that
// starts sends its reply channel on calls.
type gatedCheck struct {
	calls            chan chan error
	inFlight, most   atomic.Int32
	started, replied atomic.Int32
}

func newGatedCheck() *gatedCheck { return &gatedCheck{calls: make(chan chan error)} }

func (g *gatedCheck) check(ctx context.Context) error {
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for {
		m := g.most.Load()
		if n <= m || g.most.CompareAndSwap(m, n) {
			break
		}
	}
	g.started.Add(1)
	reply := make(chan error)
	select {
	case g.calls <- reply:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next waits for the next check to start, with a generous bound.
func (g *gatedCheck) next(t *testing.T) chan error {
	t.Helper()
	select {
	case r := <-g.calls:
		return r
	case <-time.After(time.Minute):
		t.Fatal("no confirmation check started within a minute")
		return nil
	}
}

// timerClock is a fake clock that signals every AfterFunc it schedules.
type timerClock struct {
	*clock.Fake
	scheduled chan struct{}
}

func (c timerClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.scheduled <- struct{}{}
	return t
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
	}
}

func waitErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer within a minute", what)
		return nil
	}
}

// confirmEnv is ownerEnv with confirmed delivery.
func confirmEnv(t *testing.T, conf core.Confirmer) *storeEnv {
	t.Helper()
	e := newStoreEnv(t, core.Config{Confirm: conf}, nil)
	for _, id := range e.node.Plan().Local {
		e.node.SetLease(core.NotOwned(id))
	}
	e.node.Start()
	return e
}

var errLeaseGone = fmt.Errorf("%w: etcd no longer holds members/n1 on this lease", core.ErrUnconfirmed)

// A wait is answered only by a check that started after it; the waits
// that arrive while a check runs share the next one; never two in flight;
// after a failure the next check waits out the retry pause.
func TestConfirmationsStartAfterTheWait(t *testing.T) {
	g := newGatedCheck()
	clk := timerClock{clock.NewFake(), make(chan struct{}, 1)}
	c := core.NewConfirmations(g.check, clk, time.Second)
	defer c.Close()
	joined := make(chan struct{}, 8)
	c.SetOnWait(func() { joined <- struct{}{} })
	confirm := func() <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- c.Confirm(context.Background()) }()
		return ch
	}

	a := confirm()
	first := g.next(t)
	waitFor(t, joined, "wait a joined")
	b, d := confirm(), confirm()
	waitFor(t, joined, "wait b joined")
	waitFor(t, joined, "wait d joined")
	first <- nil
	if err := waitErr(t, a, "wait a"); err != nil {
		t.Fatalf("Confirm (before the first check) = %v; want nil", err)
	}
	second := g.next(t)
	select {
	case err := <-b:
		t.Fatalf("a wait that arrived while the first check ran was answered by it (%v); want the next check's answer", err)
	case err := <-d:
		t.Fatalf("a wait that arrived while the first check ran was answered by it (%v); want the next check's answer", err)
	default:
	}
	second <- errLeaseGone
	for _, ch := range []<-chan error{b, d} {
		if err := waitErr(t, ch, "waits b, d"); !errors.Is(err, core.ErrUnconfirmed) {
			t.Fatalf("Confirm (during the first check) = %v; want ErrUnconfirmed", err)
		}
	}

	// The failure pauses the next check by the retry delay.
	waitFor(t, clk.scheduled, "the retry pause")
	e := confirm()
	waitFor(t, joined, "wait e joined")
	if got := g.started.Load(); got != 2 {
		t.Fatalf("checks started before the retry pause ended = %d; want 2", got)
	}
	clk.Advance(time.Second)
	g.next(t) <- nil
	if err := waitErr(t, e, "wait e"); err != nil {
		t.Fatalf("Confirm after the pause = %v; want nil", err)
	}
	if got := g.most.Load(); got != 1 {
		t.Fatalf("checks in flight at once = %d; want 1", got)
	}
	if got := c.Checks(); got != 3 {
		t.Fatalf("Checks() = %d; want 3", got)
	}
}

// Events of four shards read while a check runs wait for the next check;
// when it shows the lease gone, none of them is delivered or counted, each
// shard logs fenced-read and stops (lease lost); the event read before the
// first check is delivered when that check succeeds.
func TestUnconfirmedReadsNeverDelivered(t *testing.T) {
	g := newGatedCheck()
	conf := core.NewConfirmations(g.check, nil, 0)
	defer conf.Close()
	joined := make(chan struct{}, 8)
	conf.SetOnWait(func() { joined <- struct{}{} })
	e := confirmEnv(t, conf)
	for id := 0; id < 4; id++ {
		e.grant(id, uint64(10+id), 10*time.Second)
		e.ready(id, 1)
	}
	var mu sync.Mutex
	delivered := map[int][]int64{}
	read := func(id int, seq int64) <-chan struct{} {
		done := make(chan struct{})
		l := e.conn(id).Link
		go func() {
			defer close(done)
			if l.Confirmed() {
				l.DispatchDo(seq, func() {
					mu.Lock()
					delivered[id] = append(delivered[id], seq)
					mu.Unlock()
				})
			}
		}()
		return done
	}
	r0 := read(0, 2)
	first := g.next(t)
	waitFor(t, joined, "shard 0's wait")
	var rs []<-chan struct{}
	for id := 1; id < 4; id++ {
		rs = append(rs, read(id, 2))
		waitFor(t, joined, fmt.Sprintf("shard %d's wait", id))
	}
	first <- nil
	waitFor(t, r0, "shard 0's reader")
	g.next(t) <- errLeaseGone
	for i, r := range rs {
		waitFor(t, r, fmt.Sprintf("shard %d's reader", i+1))
	}

	mu.Lock()
	defer mu.Unlock()
	if got := delivered[0]; len(got) != 1 || got[0] != 2 {
		t.Fatalf("shard 0 delivered %v; want [2] (read before the successful check)", got)
	}
	if d := e.diag(0); d.State != core.Ready || d.Sequence != 2 {
		t.Fatalf("shard 0: state %v sequence %d; want READY 2", d.State, d.Sequence)
	}
	for id := 1; id < 4; id++ {
		if got := delivered[id]; len(got) != 0 {
			t.Errorf("shard %d delivered %v after a failed confirmation; want nothing", id, got)
		}
		d := e.diag(id)
		if d.State != core.Stopped || d.Sequence != 1 {
			t.Errorf("shard %d: state %v sequence %d; want STOPPED 1", id, d.State, d.Sequence)
		}
		ev := e.events(id)
		if !strings.Contains(ev, "event=fenced-read") || !strings.Contains(ev, "dropped=1") || !strings.Contains(ev, `reason="lease lost"`) {
			t.Errorf("shard %d's events lack fenced-read dropped=1 and a stop for lease lost:\n%s", id, ev)
		}
	}
}

// Each shard delivers in the order it read, and two shards reading at
// once share the checks, never two in flight.
func TestConfirmedDeliveryKeepsOrder(t *testing.T) {
	g := newGatedCheck()
	conf := core.NewConfirmations(g.check, nil, 0)
	defer conf.Close()
	e := confirmEnv(t, conf)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case r := <-g.calls:
				r <- nil
			case <-stop:
				return
			}
		}
	}()
	const last = 40
	var mu sync.Mutex
	delivered := map[int][]int64{}
	var wg sync.WaitGroup
	for id := 0; id < 2; id++ {
		e.grant(id, uint64(10+id), time.Hour)
		e.ready(id, 1)
		l := e.conn(id).Link
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int64(2); seq <= last; seq++ {
				if l.Confirmed() {
					l.DispatchDo(seq, func() {
						mu.Lock()
						delivered[id] = append(delivered[id], seq)
						mu.Unlock()
					})
				}
			}
		}()
	}
	wg.Wait()
	for id := 0; id < 2; id++ {
		got := delivered[id]
		if len(got) != last-1 {
			t.Fatalf("shard %d delivered %d events; want %d", id, len(got), last-1)
		}
		for i, seq := range got {
			if seq != int64(i+2) {
				t.Fatalf("shard %d delivered %v; want 2..%d in order", id, got, last)
			}
		}
		if d := e.diag(id); d.Sequence != last {
			t.Fatalf("shard %d sequence = %d; want %d", id, d.Sequence, last)
		}
	}
	if got := g.most.Load(); got != 1 {
		t.Fatalf("checks in flight at once = %d; want 1", got)
	}
}

// A check that cannot tell (etcd unreachable) holds the event while the
// fence is open, then drops it once the fence closed.
func TestUnconfirmedUntilTheFenceCloses(t *testing.T) {
	g := newGatedCheck()
	conf := core.NewConfirmations(g.check, nil, time.Nanosecond)
	defer conf.Close()
	e := confirmEnv(t, conf)
	e.grant(0, 7, 10*time.Second)
	e.ready(0, 1)
	l := e.conn(0).Link
	var delivered atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l.Confirmed() {
			l.DispatchDo(2, func() { delivered.Store(true) })
		}
	}()
	unreachable := errors.New("etcdserver: no leader")
	g.next(t) <- unreachable
	g.next(t) <- unreachable // asked again: the fence is still open
	third := g.next(t)
	e.clk.JumpWall(11 * time.Second)
	third <- unreachable
	waitFor(t, done, "the reader")
	if delivered.Load() {
		t.Fatal("an event never confirmed was delivered")
	}
	if ev := e.events(0); !strings.Contains(ev, "event=fenced-read") || !strings.Contains(ev, "no leader") {
		t.Fatalf("events lack the fenced-read line naming the error:\n%s", ev)
	}
}
