package core_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
)

// grant is an ownership grant of shard at generation gen, valid for d from
// the fake clock's now.
func (e *env) grant(shard int, gen uint64, d time.Duration) {
	e.node.SetLease(core.LeaseGrant{Shard: shard, Owner: true, Generation: gen, Deadline: e.clk.Now().Add(d)})
}

// ownerEnv is an etcd-style node: every candidate starts not owned.
func ownerEnv(t *testing.T, store *coretest.Store) *storeEnv {
	t.Helper()
	e := newStoreEnv(t, core.Config{}, store)
	for _, id := range e.node.Plan().Local {
		e.node.SetLease(core.NotOwned(id))
	}
	e.node.Start()
	return e
}

// The fence of a connection follows renewals of its grant on the
// monotonic clock, ignores a wall-clock step, is replaced at a new
// generation, and forbids writes at the deadline even while the shard is
// still READY because the lease timer has not run yet (the pause hazard:
// overdue timers fire in any order).
func TestFenceFollowsGrant(t *testing.T) {
	e := ownerEnv(t, nil)
	if len(e.tr.Conns()) != 0 || len(e.store.Calls()) != 0 {
		t.Fatalf("unowned candidates connected (%d) or called the store (%v)", len(e.tr.Conns()), e.store.Calls())
	}
	e.wantState(0, core.Stopped)
	if d := e.diag(0); d.StopReason != core.StoppedNotOwned || d.Owned() {
		t.Fatalf("unowned candidate: reason %q owned %v; want not owned", d.StopReason, d.Owned())
	}
	// A "heartbeat" timer due at the deadline, created before the lease
	// timer, so that it fires first, as after a SIGCONT.
	var allowedAtDeadline, readyAtDeadline = true, false
	e.clk.AfterFunc(10*time.Second, func() {
		c := e.tr.Last(0)
		allowedAtDeadline = c.Attempt.Fence.Allows(clock.Mono(e.clk))
		d, _ := e.node.Diag(0)
		readyAtDeadline = d.State == core.Ready
	})
	e.grant(0, 7, 10*time.Second)
	e.ready(0, 1)
	c := e.conn(0)
	f := c.Attempt.Fence
	if f == nil || !f.Allows(clock.Mono(e.clk)) {
		t.Fatalf("connection of an owned shard has fence %v; want one that allows writes now", f)
	}
	if until, ok := f.Until(); !ok || until != clock.Mono(e.clk)+10*time.Second {
		t.Fatalf("fence until %v %v; want mono+10s", until, ok)
	}
	e.clk.Advance(3 * time.Second)
	e.clk.JumpWall(time.Hour) // an operator sets the clock: the fence must not move
	e.clk.JumpWall(-time.Hour)
	e.grant(0, 7, 7*time.Second) // a renewal, deadline unchanged at mono 10 s
	if until, _ := f.Until(); until != 10*time.Second {
		t.Fatalf("after a renewal to the same deadline the fence is at %v; want 10s", until)
	}
	e.clk.Advance(7 * time.Second)
	if allowedAtDeadline || !readyAtDeadline {
		t.Fatalf("at the deadline, before the lease timer: fence allowed %v (want false), shard READY %v (want true)", allowedAtDeadline, readyAtDeadline)
	}
	d := e.diag(0)
	if d.State != core.Stopped || d.StopReason != core.StoppedByLeaseLost {
		t.Fatalf("after the deadline: %v %q; want STOPPED lease lost", d.State, d.StopReason)
	}
	if got := c.Closed(); len(got) == 0 || got[0] != 4000 {
		t.Fatalf("close codes %v; want 4000", got)
	}
	if !strings.Contains(e.events(0), `event=stopped state=STOPPED reason="lease lost"`) {
		t.Fatalf("no lease lost line in events:\n%s", e.events(0))
	}
	for _, call := range e.store.Calls() {
		if call.Op == "save" {
			t.Fatalf("a lost lease saved a snapshot: %v", call)
		}
	}
	// A late renewal of the old generation does not move the old fence
	// past what was granted; a new generation gets a new fence.
	e.grant(0, 9, 10*time.Second)
	c2 := e.conn(0)
	if c2 == c || c2.Attempt.Fence == f {
		t.Fatal("a new generation reused the old connection or fence")
	}
	if f.Allows(clock.Mono(e.clk)) {
		t.Fatal("the old connection's fence allows writes after the new grant")
	}
	if d := e.diag(0); d.Lease.Generation != 9 || !d.Owned() {
		t.Fatalf("diag after new grant: generation %d owned %v", d.Lease.Generation, d.Owned())
	}
	if d := e.diag(0); !strings.Contains(string(d.AppendText(nil, e.clk.Now())), "owner_generation 9\n") {
		t.Fatalf("diag lacks owner_generation 9:\n%s", d.AppendText(nil, e.clk.Now()))
	}
}

// A shard granted a new generation after a lost lease forgets its own
// session and resumes the snapshot the store holds (the previous owner's
// handover), marking it used first; without one it identifies.
func TestNewGenerationReloadsSnapshot(t *testing.T) {
	store := &coretest.Store{}
	store.Put(1, snapAt(core.Discord, 5*time.Second))
	e := ownerEnv(t, store)
	e.grant(1, 5, 10*time.Second)
	c := e.conn(1)
	if !c.Attempt.Resume || c.Attempt.Session.ID != restoredID {
		t.Fatalf("first grant: resume %v; want the stored session resumed", c.Attempt.Resume)
	}
	if got, _ := store.Get(1); !got.Used() {
		t.Fatal("the snapshot was not marked used before the resume")
	}
	c.Link.Resumed(80)
	e.clk.Advance(11 * time.Second) // lease lost
	if d := e.diag(1); d.StopReason != core.StoppedByLeaseLost {
		t.Fatalf("reason %q; want lease lost", d.StopReason)
	}
	// Another node owned it meanwhile and handed it back.
	other := snapAt(core.Discord, 0)
	other.Session.ID, other.Sequence = "other-owner-session", 120
	store.Put(1, other)
	e.grant(1, 9, 10*time.Second)
	c2 := e.conn(1)
	if c2 == c || !c2.Attempt.Resume || c2.Attempt.Session.ID != "other-owner-session" || c2.Attempt.Sequence != 120 {
		t.Fatalf("new generation: resume %v seq %d; want the other owner's session at 120", c2.Attempt.Resume, c2.Attempt.Sequence)
	}
	// Lost again; nothing stored now: the shard identifies, never resuming
	// the session another node may have resumed since.
	c2.Link.Resumed(130)
	e.clk.Advance(11 * time.Second)
	store.Put(1, func() core.Snapshot { s := other; s.Session.ID = ""; return s }())
	e.grant(1, 12, 10*time.Second)
	if c3 := e.conn(1); c3.Attempt.Resume {
		t.Fatal("a shard with no resumable snapshot resumed its old session after a new generation")
	}
	e.checkNoSecret(t)
}

// A shard whose lease was lost (an etcd outage) and that gets a new
// generation marked Continues (nobody else owned it meanwhile) keeps the
// session in memory and resumes it at its last sequence: no identify, no
// store load. Without Continues it forgets it (TestNewGenerationReloadsSnapshot);
// Continues never revives a shard stopped otherwise (moved, operator).
func TestContinuesKeepsSession(t *testing.T) {
	store := &coretest.Store{}
	e := ownerEnv(t, store)
	e.grant(0, 5, 10*time.Second)
	e.ready(0, 1)
	c := e.conn(0)
	e.clk.Advance(11 * time.Second) // lease lost
	if d := e.diag(0); d.StopReason != core.StoppedByLeaseLost {
		t.Fatalf("reason %q; want lease lost", d.StopReason)
	}
	loads := len(store.Calls())
	e.node.SetLease(core.LeaseGrant{Shard: 0, Owner: true, Generation: 9, Deadline: e.clk.Now().Add(10 * time.Second), Continues: true})
	c2 := e.conn(0)
	if c2 == c || !c2.Attempt.Resume || c2.Attempt.Session.ID != secretSession || c2.Attempt.Sequence != 1 {
		t.Fatalf("continued generation: new conn %v, resume %v, sequence %d; want its own session resumed at 1", c2 != c, c2.Attempt.Resume, c2.Attempt.Sequence)
	}
	if got := store.Calls()[loads:]; len(got) != 0 {
		t.Fatalf("a continued generation called the store: %v", got)
	}
	if !strings.Contains(e.events(0), "event=session-kept") {
		t.Fatalf("no session-kept line:\n%s", e.events(0))
	}
	// A shard handed over (moved) is not revived by Continues: the other
	// node resumed its session.
	c2.Link.Resumed(2)
	if _, err := e.node.Handover(0); err != nil {
		t.Fatal(err)
	}
	other := snapAt(core.Discord, 0)
	other.Session.ID, other.Sequence = "other-owner-session", 120
	store.Put(0, other)
	e.node.SetLease(core.LeaseGrant{Shard: 0, Owner: true, Generation: 12, Deadline: e.clk.Now().Add(10 * time.Second), Continues: true})
	if c3 := e.conn(0); c3 == c2 || !c3.Attempt.Resume || c3.Attempt.Session.ID != "other-owner-session" {
		t.Fatalf("a moved shard on a Continues grant: new conn %v, resume %v; want the stored session (the other owner's), not its own", c3 != c2, c3.Attempt.Resume)
	}
	e.checkNoSecret(t)
}

// Handover stops with 4000 (reason moved), saves, and returns saved; a
// renewal of the old generation does not restart the shard, a new
// generation does.
func TestHandover(t *testing.T) {
	e := ownerEnv(t, nil)
	e.grant(2, 4, 10*time.Second)
	e.ready(2, 1)
	c := e.conn(2)
	c.Link.Dispatch(55)
	saved, err := e.node.Handover(2)
	if err != nil || !saved {
		t.Fatalf("Handover = %v, %v; want saved", saved, err)
	}
	if got := c.Closed(); len(got) != 1 || got[0] != 4000 {
		t.Fatalf("close codes %v; want [4000]", got)
	}
	snap, ok := e.store.Get(2)
	if !ok || snap.Used() || snap.Sequence != 55 {
		t.Fatalf("stored %+v %v; want a resumable snapshot at 55", snap, ok)
	}
	d := e.diag(2)
	if d.State != core.Stopped || d.StopReason != core.StoppedByMove || d.Owned() {
		t.Fatalf("after handover: %v %q owned %v; want STOPPED moved, not owned", d.State, d.StopReason, d.Owned())
	}
	if err := e.node.ExecShard(2, "start"); err == nil {
		t.Fatal("start of a moved shard was accepted")
	}
	e.grant(2, 4, 10*time.Second) // a renewal racing the handover
	if n := len(e.tr.Conns()); n != 1 || e.diag(2).State != core.Stopped {
		t.Fatalf("a renewal of the old generation restarted the moved shard (%d connections)", n)
	}
	e.clk.Advance(20 * time.Second)
	if d := e.diag(2); d.StopReason != core.StoppedByMove {
		t.Fatalf("the old deadline changed the reason to %q", d.StopReason)
	}
	if _, err := e.node.Handover(99); err == nil {
		t.Fatal("Handover of an unknown shard succeeded")
	}
}

// A grant of a new generation after a move that arrives already expired
// (its snapshot load took longer than the deadline: an etcd member cut off
// from the others held the load 5 s at TTL 3 s) leaves the shard stopped,
// but the renewals of that generation must start it: the move was of the
// old generation. The shard stayed STOPPED "moved" under the new
// generation, its key held, so on no node (attack22 F1, 52 s and more).
func TestGrantAfterMoveArrivingExpired(t *testing.T) {
	e := ownerEnv(t, nil)
	e.grant(2, 4, 10*time.Second)
	e.ready(2, 1)
	if _, err := e.node.Handover(2); err != nil {
		t.Fatal(err)
	}
	e.grant(2, 9, -time.Second)
	if d := e.diag(2); d.State != core.Stopped {
		t.Fatalf("after an expired grant: %v; want STOPPED", d.State)
	}
	e.grant(2, 9, 10*time.Second)
	if d := e.diag(2); d.State == core.Stopped {
		t.Fatalf("a renewal of the new generation left the shard %v %q; want it started", d.State, d.StopReason)
	}
}

// Handover returns only once the old connection can write no more, so that
// the caller releases the shard's key after its last frame (the failover
// soak saw a heartbeat reach the gateway a second after the release); a
// connection that does not end is waited for HandoverWait, then fenced,
// aborted and said.
func TestHandoverWaitsForTheOldConnection(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ends, stopped bool
	}{{"ends", true, false}, {"hangs", false, false}, {"stopped-before", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ends := tc.ends
			e := ownerEnv(t, nil)
			e.tr.Enders = true
			e.grant(2, 4, 10*time.Second)
			e.ready(2, 1)
			c := e.conn(2)
			if tc.stopped {
				// stop closed it; it may still be sending its close frame.
				if err := e.node.ExecShard(2, "stop"); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if _, err := e.node.Handover(2); err != nil {
					t.Error(err)
				}
			}()
			// Until Handover has armed its bound it must not return.
			for bound := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
				if d, ok := e.clk.Next(); ok && d == core.HandoverWait {
					break
				}
				select {
				case <-done:
					t.Fatal("Handover returned before the old connection ended")
				default:
				}
				if time.Now().After(bound) {
					t.Fatal("Handover neither returned nor waited")
				}
			}
			if got := c.Closed(); len(got) != 1 || got[0] != 4000 {
				t.Fatalf("close codes %v; want [4000] before the wait", got)
			}
			if ends {
				c.End()
			} else {
				e.clk.Advance(core.HandoverWait)
			}
			<-done
			slow := strings.Contains(e.events(2), "event=handover-slow")
			if slow == ends {
				t.Fatalf("handover-slow line %v; want %v:\n%s", slow, !ends, e.events(2))
			}
			// Issue 22 item 7: a connection that outlasts the wait is
			// fenced now and its socket closed before Handover returns
			// (and the caller releases the key); it kept its fence, and
			// its socket, before.
			if fenced := !c.Attempt.Fence.Allows(clock.Mono(e.clk)); fenced != !ends {
				t.Fatalf("old connection fenced %v after Handover; want %v", fenced, !ends)
			}
			if c.Aborted() == ends {
				t.Fatalf("old connection aborted %v; want %v", c.Aborted(), !ends)
			}
		})
	}
}

// The fence covers reads (DESIGN 7.3): a dispatch the connection received
// at the deadline is neither delivered nor counted, even while the shard
// is still READY because the lease timer has not run yet (a node woken
// from a pause, its reader running before its overdue lease timer); and a
// wall clock past the grant's deadline closes the fence too, until a
// renewal moves it.
func TestFenceClosesReads(t *testing.T) {
	e := ownerEnv(t, nil)
	delivered := map[int64]bool{}
	var readyAtDeadline bool
	// Due at the deadline and created before the lease timer, so that it
	// fires first.
	e.clk.AfterFunc(10*time.Second, func() {
		c := e.tr.Last(0)
		readyAtDeadline = e.diag(0).State == core.Ready
		c.Link.DispatchDo(3, func() { delivered[3] = true })
	})
	e.grant(0, 7, 10*time.Second)
	e.ready(0, 1)
	c := e.conn(0)
	c.Link.DispatchDo(2, func() { delivered[2] = true })
	if !delivered[2] || e.diag(0).Sequence != 2 {
		t.Fatalf("dispatch before the deadline: delivered %v, sequence %d; want delivered, 2", delivered[2], e.diag(0).Sequence)
	}

	// The wall clock steps past the deadline: the fence closes at once.
	e.clk.Advance(3 * time.Second)
	e.clk.JumpWall(8 * time.Second)
	c.Link.DispatchDo(4, func() { delivered[4] = true })
	if delivered[4] || e.diag(0).Sequence != 2 {
		t.Fatalf("dispatch with the wall clock past the deadline: delivered %v, sequence %d; want neither (sequence 2)", delivered[4], e.diag(0).Sequence)
	}
	e.clk.JumpWall(-8 * time.Second)
	e.grant(0, 7, 7*time.Second) // a renewal: deadline unchanged on both clocks
	c.Link.DispatchDo(5, func() { delivered[5] = true })
	if !delivered[5] {
		t.Fatal("dispatch after the wall clock came back and a renewal: not delivered; want delivered")
	}

	e.clk.Advance(7 * time.Second)
	if !readyAtDeadline {
		t.Fatal("the probe did not run while the shard was READY at its deadline")
	}
	if delivered[3] {
		t.Fatal("a dispatch received at the deadline, before the lease timer ran, was delivered")
	}
	if got := e.diag(0).Sequence; got != 5 {
		t.Fatalf("sequence after the deadline = %d; want 5 (the fenced dispatch not counted)", got)
	}
	// Nothing received past the fence reaches the events either: a READY
	// read with the wall clock past a new grant's deadline is dropped.
	e.grant(0, 9, 10*time.Second)
	c2 := e.conn(0)
	if c2 == c {
		t.Fatal("the new generation did not open a new connection")
	}
	e.clk.JumpWall(11 * time.Second)
	c2.Link.Ready(core.Session{ID: secretSession, ResumeURL: "wss://resume.example"}, 9)
	if d := e.diag(0); d.State == core.Ready || strings.Contains(e.events(0), "sequence=9") {
		t.Fatalf("a READY received past the fence: state %v; want not READY and no ready line\n%s", d.State, e.events(0))
	}
}
