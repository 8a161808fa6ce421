package etcd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/soak"
)

func TestMain(m *testing.M) {
	soak.MaybeRunEtcd() // TestOwnershipEtcdOutageContinues runs etcd as a child process of this binary
	goleak.VerifyTestMain(m)
}

// testLog returns a logger writing to t.Log, and the text it wrote.
func testLog(t *testing.T) (*slog.Logger, *logBuf) {
	b := &logBuf{t: t}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

type logBuf struct {
	t  *testing.T
	mu sync.Mutex
	sb strings.Builder
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sb.Write(p)
	b.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (b *logBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

var _ io.Writer = (*logBuf)(nil)

// fakeLease hands every KeepAliveOnce to the test, which answers it when
// it likes in fake time.
type fakeLease struct {
	clientv3.Lease
	calls chan *kaCall
	// ignoreCtx models an answer already on its way when the call's
	// context ends.
	ignoreCtx bool
}

type kaCall struct {
	at     time.Duration // monotonic send time
	answer chan kaAnswer
}

type kaAnswer struct {
	ttl int64
	err error
}

func (f *fakeLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	c := &kaCall{answer: make(chan kaAnswer, 1)}
	f.calls <- c
	var a kaAnswer
	if f.ignoreCtx {
		a = <-c.answer
	} else {
		select {
		case a = <-c.answer:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if a.err != nil {
		return nil, a.err
	}
	return &clientv3.LeaseKeepAliveResponse{ID: id, TTL: a.ttl}, nil
}

func (f *fakeLease) Revoke(context.Context, clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	return &clientv3.LeaseRevokeResponse{}, nil
}

// fenceRig is a Member whose lease is a fakeLease, on a fake clock.
type fenceRig struct {
	t     *testing.T
	log   *logBuf
	clk   *clock.Fake
	lease *fakeLease
	m     *Member
	after chan error
}

func newFenceRig(t *testing.T, ttl time.Duration) *fenceRig {
	log, buf := testLog(t)
	r := &fenceRig{t: t, log: buf, clk: clock.NewFake(), lease: &fakeLease{calls: make(chan *kaCall, 1)}, after: make(chan error, 1)}
	r.m = &Member{bot: "b", node: "a", plan: Plan{"discord", 4}, prefix: Prefix("b"), lease: r.lease, clock: r.clk, log: log}
	r.m.start(1, ttl, clock.Mono(r.clk), func(err error) { r.after <- err })
	t.Cleanup(func() {
		if err := r.m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// bound is a guard against a hung test, not a wait for a state: the loop
// answers within microseconds once the fake clock has fired.
const bound = 10 * time.Second

func (r *fenceRig) call() *kaCall {
	r.t.Helper()
	select {
	case c := <-r.lease.calls:
		c.at = clock.Mono(r.clk)
		return c
	case <-time.After(bound):
		r.t.Fatalf("no KeepAliveOnce at Mono %v", clock.Mono(r.clk))
		return nil
	}
}

func (r *fenceRig) answer(c *kaCall, ttl int64, err error) error {
	r.t.Helper()
	c.answer <- kaAnswer{ttl, err}
	select {
	case err := <-r.after:
		return err
	case <-time.After(bound):
		r.t.Fatal("renewal not processed")
		return nil
	}
}

func (r *fenceRig) noCall() {
	r.t.Helper()
	select {
	case c := <-r.lease.calls:
		r.t.Fatalf("unexpected KeepAliveOnce at Mono %v", c.at)
	default:
	}
}

func isDone(m *Member) bool {
	select {
	case <-m.Done():
		return true
	default:
		return false
	}
}

func TestFenceDeadlineFromSendTime(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	if got := r.m.Remaining(); got != 9*time.Second {
		t.Fatalf("Remaining() after grant = %v; want TTL-1s = 9s", got)
	}
	third := 10 * time.Second / 3
	if d, _ := r.clk.Next(); d != third {
		t.Fatalf("first renewal due in %v; want TTL/3 = %v", d, third)
	}
	r.clk.Advance(third)
	c := r.call()
	// The answer takes 2 s: the deadline counts from the send, not the answer.
	r.clk.Advance(2 * time.Second)
	if err := r.answer(c, 10, nil); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if got, want := r.m.Remaining(), third+9*time.Second-(third+2*time.Second); got != want {
		t.Fatalf("Remaining() = %v; want send time + TTL - 1s - now = %v", got, want)
	}
	if d, _ := r.clk.Next(); d != third-2*time.Second {
		t.Fatalf("next renewal due in %v; want %v (TTL/3 after the last send)", d, third-2*time.Second)
	}
	// etcd may grant a different TTL than asked; the granted one counts.
	r.clk.Advance(third - 2*time.Second)
	c = r.call()
	if err := r.answer(c, 4, nil); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if got := r.m.Remaining(); got != 3*time.Second {
		t.Fatalf("Remaining() after a 4 s grant = %v; want 3s", got)
	}
	if isDone(r.m) || r.m.Err() != nil {
		t.Fatalf("membership ended: %v", r.m.Err())
	}
}

func TestFenceSteadyCadence(t *testing.T) {
	r := newFenceRig(t, 9*time.Second)
	for i := 1; i <= 9; i++ {
		r.clk.Advance(3 * time.Second)
		c := r.call()
		if want := time.Duration(i) * 3 * time.Second; c.at != want {
			t.Fatalf("renewal %d sent at %v; want %v", i, c.at, want)
		}
		if err := r.answer(c, 9, nil); err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		r.noCall()
	}
	if r.m.renewals != 9 {
		t.Fatalf("renewals = %d; want 9", r.m.renewals)
	}
}

func TestFenceLateAnswerDoesNotRevive(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	r.lease.ignoreCtx = true
	third := 10 * time.Second / 3
	r.clk.Advance(third)
	c := r.call()
	r.clk.Advance(9*time.Second - third - time.Nanosecond)
	if isDone(r.m) {
		t.Fatal("Done closed 1ns before the deadline")
	}
	r.clk.Advance(time.Nanosecond)
	if !isDone(r.m) || !errors.Is(r.m.Err(), ErrLeaseLost) {
		t.Fatalf("at the deadline: done %v, Err %v; want closed, ErrLeaseLost", isDone(r.m), r.m.Err())
	}
	// The answer arrives after the deadline and says the lease lives.
	if err := r.answer(c, 10, nil); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("late renewal = %v; want ErrLeaseLost", err)
	}
	if got := r.m.Remaining(); got != 0 {
		t.Fatalf("Remaining() after a late answer = %v; want 0", got)
	}
	r.clk.Advance(time.Second)
	if got := r.m.Deadline().Sub(r.clk.Now()); got != -time.Second {
		t.Fatalf("Deadline() 1s after the loss = Now%+v; want Now-1s (the deadline that passed)", got)
	}
	if r.clk.Pending() != 0 {
		t.Fatalf("%d timers pending after the loss; want 0", r.clk.Pending())
	}
	r.clk.Advance(time.Hour)
	r.noCall()
}

func TestFenceWallJumpDoesNotMoveDeadline(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	third := 10 * time.Second / 3
	r.clk.Advance(third)
	c := r.call() // never answered in time
	for _, jump := range []time.Duration{time.Hour, -3 * time.Hour, 24 * time.Hour} {
		r.clk.JumpWall(jump)
		if got, want := r.m.Remaining(), 9*time.Second-third; got != want {
			t.Fatalf("Remaining() after a wall jump of %v = %v; want %v", jump, got, want)
		}
		if got, want := r.m.Deadline().Sub(r.clk.Now()), 9*time.Second-third; got != want {
			t.Fatalf("Deadline()-Now() after a wall jump of %v = %v; want %v", jump, got, want)
		}
	}
	r.clk.Advance(9*time.Second - third - time.Nanosecond)
	if isDone(r.m) {
		t.Fatal("a wall jump brought the loss forward")
	}
	r.clk.Advance(time.Nanosecond)
	if !isDone(r.m) {
		t.Fatal("not lost at the monotonic deadline after wall jumps")
	}
	// The call was cancelled by the loss.
	select {
	case err := <-r.after:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("cancelled renewal = %v; want ErrLeaseLost", err)
		}
	case <-time.After(bound):
		t.Fatal("renewal in flight not cancelled by the loss")
	}
	_ = c
}

// A step of the wall clock is logged at the next renewal, once, with its
// size; time passing normally logs nothing.
func TestFenceWallStepLogged(t *testing.T) {
	r := newFenceRig(t, 9*time.Second)
	buf := r.log
	r.clk.Advance(3 * time.Second)
	if err := r.answer(r.call(), 9, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "wall clock stepped") {
		t.Fatalf("logged a step without one:\n%s", buf)
	}
	r.clk.JumpWall(-90 * time.Minute)
	r.clk.Advance(3 * time.Second)
	if err := r.answer(r.call(), 9, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "wall clock stepped") || !strings.Contains(buf.String(), "step=-1h30m0s") {
		t.Fatalf("no line for a wall step of -1h30m:\n%s", buf)
	}
	r.clk.Advance(3 * time.Second)
	if err := r.answer(r.call(), 9, nil); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "wall clock stepped"); n != 1 {
		t.Fatalf("%d lines for one step:\n%s", n, buf)
	}
}

func TestFenceErrorsRetryUntilDeadline(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	third := 10 * time.Second / 3
	r.clk.Advance(third)
	unavailable := errors.New("etcdserver: unavailable")
	var sends []time.Duration
	for !isDone(r.m) {
		c := r.call()
		sends = append(sends, c.at)
		if err := r.answer(c, 0, unavailable); !errors.Is(err, unavailable) {
			t.Fatalf("failed renewal = %v; want it to wrap %v", err, unavailable)
		}
		r.clk.Advance(time.Second) // retryDelay = TTL/10
	}
	if len(sends) != 6 || sends[0] != third || sends[5] != third+5*time.Second {
		t.Fatalf("renewals sent at %v; want 6, every 1s from %v", sends, third)
	}
	if got := clock.Mono(r.clk); got != third+6*time.Second {
		t.Fatalf("lost at %v; want detected by %v", got, third+6*time.Second)
	}
	if !errors.Is(r.m.Err(), ErrLeaseLost) {
		t.Fatalf("Err() = %v; want ErrLeaseLost", r.m.Err())
	}
}

func TestFenceRecoversBeforeDeadline(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	third := 10 * time.Second / 3
	r.clk.Advance(third)
	r.answer(r.call(), 0, errors.New("unavailable"))
	r.clk.Advance(time.Second)
	c := r.call()
	if err := r.answer(c, 10, nil); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if got, want := r.m.Remaining(), 9*time.Second; got != want {
		t.Fatalf("Remaining() after a retry succeeded = %v; want %v", got, want)
	}
}

func TestFenceLeaseNotFoundLosesAtOnce(t *testing.T) {
	for _, a := range []kaAnswer{{err: rpctypes.ErrLeaseNotFound}, {ttl: -1}} {
		r := newFenceRig(t, 10*time.Second)
		r.clk.Advance(10 * time.Second / 3)
		if err := r.answer(r.call(), a.ttl, a.err); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("answer %+v: renewal = %v; want ErrLeaseLost", a, err)
		}
		if !isDone(r.m) {
			t.Fatalf("answer %+v: membership still live", a)
		}
	}
}

func TestCloseEndsMembership(t *testing.T) {
	r := newFenceRig(t, 10*time.Second)
	if err := r.m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !isDone(r.m) || !errors.Is(r.m.Err(), ErrClosed) {
		t.Fatalf("after Close: done %v, Err %v; want closed, ErrClosed", isDone(r.m), r.m.Err())
	}
	if _, err := r.m.Guarded(context.Background(), 0, 5); !errors.Is(err, ErrClosed) {
		t.Fatalf("Guarded after Close = %v; want ErrClosed", err)
	}
	if _, err := r.m.Acquire(context.Background(), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close = %v; want ErrClosed", err)
	}
}

// The operator's lease composes (DESIGN 7.3): while MayRenew says no, no
// renewal is sent, so the membership runs out at its deadline; once it
// says yes again before that, renewals resume.
func TestFenceMayRenew(t *testing.T) {
	r := newFenceRig(t, 9*time.Second)
	var allowed atomic.Bool
	allowed.Store(true)
	r.m.mayRenew = allowed.Load
	r.clk.Advance(3 * time.Second)
	if err := r.answer(r.call(), 9, nil); err != nil {
		t.Fatal(err)
	}
	allowed.Store(false)
	r.clk.Advance(3 * time.Second) // renewal due: held back
	if err := <-r.after; !errors.Is(err, errNotRenewing) {
		t.Fatalf("renewal attempt = %v; want errNotRenewing", err)
	}
	r.noCall()
	allowed.Store(true)
	r.clk.Advance(r.m.retryDelay())
	if err := r.answer(r.call(), 9, nil); err != nil {
		t.Fatalf("renewal after MayRenew turned true: %v", err)
	}
	allowed.Store(false)
	deadline := clock.Mono(r.clk) + 8*time.Second
	for clock.Mono(r.clk) < deadline-time.Millisecond && !isDone(r.m) {
		d, _ := r.clk.Next()
		r.clk.Advance(d)
		select {
		case <-r.after:
		default:
		}
		r.noCall()
	}
	r.clk.Advance(time.Millisecond)
	if !isDone(r.m) || !errors.Is(r.m.Err(), ErrLeaseLost) || clock.Mono(r.clk) < deadline {
		t.Fatalf("at Mono %v (deadline %v): done %v, err %v; want lost at the deadline", clock.Mono(r.clk), deadline, isDone(r.m), r.m.Err())
	}
}
