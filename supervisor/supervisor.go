package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/clock"
)

// State is a child's state, as /children shows it.
type State string

// The states of a child.
const (
	Idle       State = "idle"       // not started yet
	Starting   State = "starting"   // launched, not ready yet
	Running    State = "running"    // ready: its tree is served
	Restarting State = "restarting" // exited unexpectedly; waiting for the restart delay
	Stopping   State = "stopping"   // asked to exit (SIGTERM), waiting for it
	Closed     State = "closed"     // stopped on purpose
	Failed     State = "failed"     // used up its restart budget
)

// Errors of the supervisor's commands.
var (
	ErrUnknownChild = errors.New("no such child")
	ErrBusy         = errors.New("busy")
	ErrClosed       = errors.New("supervisor closed")
)

// Process is a started child, as the supervisor drives it.
type Process interface {
	Pid() int
	// Signal sends sig (syscall.SIGTERM, then syscall.SIGKILL) to the
	// child. Errors are logged; a child that is gone reports its exit
	// anyway.
	Signal(sig os.Signal) error
}

// Launch describes one start of a child.
type Launch struct {
	ID     string
	Shards []int
	// Generation counts the child's starts, from 1.
	Generation int
	// Attempt is the restart attempt of a run of unexpected exits that
	// this start is (1-based), 0 for a first start or an operator's
	// restart.
	Attempt int
	// Crashed: the previous process of the child ended without a clean
	// stop, and was reaped. A stop that needed SIGKILL is not clean: the
	// child may have saved some sessions past the last line the parent
	// got, so its snapshots are not to be trusted.
	Crashed bool
}

// Launcher starts a child. It must not call the Reports before it
// returns: a real launcher reports from the goroutines that watch the
// child.
type Launcher func(l Launch, r *Reports) (Process, error)

// Reports is how a launched child's watchers tell the supervisor what it
// does. Reports of a child's earlier generation are ignored.
type Reports struct {
	s   *Supervisor
	c   *child
	gen int
}

// Ready reports that the child serves its tree, at socket (a path the
// parent forwards to; empty when it serves none).
func (r *Reports) Ready(socket string) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen == r.gen {
		r.s.readyLocked(r.c, socket)
	}
}

// Settled reports that every shard of the child is READY.
func (r *Reports) Settled() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen == r.gen && !r.c.settled {
		r.c.settled = true
		r.s.settledLocked(r.c)
	}
}

// Broken reports that the child's private channel failed (garbage, or
// closed while the process lives): the child cannot be driven, so it is
// stopped and counts as a failure.
func (r *Reports) Broken(err error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen != r.gen || r.c.proc == nil || r.c.state == Stopping {
		return
	}
	r.s.log.Error("child's private channel failed; stopping it", "child", r.c.ID, "pid", r.c.proc.Pid(), "err", err)
	r.s.stopLocked(r.c, exitFailure)
}

// Exited reports that the child's process ended (waitpid returned); err
// is what exec.Cmd.Wait returned.
func (r *Reports) Exited(err error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen == r.gen && r.c.proc != nil {
		r.s.exitedLocked(r.c, err)
	}
}

// Config configures a Supervisor. Assignment and Launch are required.
type Config struct {
	Assignment Assignment
	Policy     Policy
	Launch     Launcher
	Clock      clock.Clock
	Logger     *slog.Logger
}

// exit intents: what the supervisor does when a child's process ends.
type intent int

const (
	exitFailure intent = iota // unexpected: the restart policy decides
	exitRestart               // the operator's restart: start again at once
	exitClose                 // stopped for good
)

type child struct {
	Block
	state    State // changed only by Supervisor.moveLocked
	proc     Process
	gen      int
	restarts int // starts after the first, whatever the reason
	attempts int // restart attempts used in the current run of failures
	lastExit string
	crashed  bool // the last process ended without a clean stop
	forced   bool // the current process was sent SIGKILL
	socket   string
	settled  bool
	intent   intent
	timer    clock.Timer // the state's one timer: startup, healthy reset, restart delay or kill
	killer   clock.Timer
}

// Supervisor runs the children of an assignment.
type Supervisor struct {
	cfg   Config
	pol   Policy
	clock clock.Clock
	log   *slog.Logger

	mu       sync.Mutex
	children []*child
	byID     map[string]*child
	closing  bool
	err      error         // why the supervisor failed
	done     chan struct{} // closed when closing and every child is down
	doneOnce sync.Once
	rollout  []*child // restart all: the children still to restart, the first in progress
	// onMove, set by tests before Start, sees every move a child makes or
	// attempts, listed or not.
	onMove func(id string, from, to State)
}

// New returns a supervisor of the assignment's children; none is started
// until Start.
func New(cfg Config) *Supervisor {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Supervisor{cfg: cfg, pol: cfg.Policy, clock: clock.Or(cfg.Clock), log: log, byID: map[string]*child{}, done: make(chan struct{})}
	for _, b := range cfg.Assignment.Blocks {
		c := &child{Block: b, state: Idle}
		s.children = append(s.children, c)
		s.byID[b.ID] = c
	}
	return s
}

// Start starts every child, in the assignment's order.
func (s *Supervisor) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.children {
		if c.state == Idle {
			s.startLocked(c, 0)
		}
	}
}

// Done is closed when the supervisor has stopped every child, after Close
// or a failure.
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Err returns why the supervisor failed, naming the child and its last
// exit, or nil.
func (s *Supervisor) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops every child (SIGTERM, SIGKILL after the shutdown timeout)
// and waits until all have exited.
func (s *Supervisor) Close() {
	s.mu.Lock()
	s.closeAllLocked()
	s.mu.Unlock()
	<-s.done
}

// ChildInfo is one line of /children.
type ChildInfo struct {
	ID         string
	State      State
	Pid        int // 0 when no process runs
	Restarts   int
	Generation int
	Shards     []int
	Socket     string
	LastExit   string
}

// String is the /children line: id state pid restarts generation shards.
func (c ChildInfo) String() string {
	pid := "none"
	if c.Pid != 0 {
		pid = strconv.Itoa(c.Pid)
	}
	return fmt.Sprintf("%s %s %s %d %d %s", c.ID, c.State, pid, c.Restarts, c.Generation, FormatShards(c.Shards))
}

// Children returns every child's line, in the assignment's order.
func (s *Supervisor) Children() []ChildInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ChildInfo, len(s.children))
	for i, c := range s.children {
		out[i] = ChildInfo{ID: c.ID, State: c.state, Restarts: c.restarts, Generation: c.gen, Shards: c.Shards, Socket: c.socket, LastExit: c.lastExit}
		if c.proc != nil {
			out[i].Pid = c.proc.Pid()
		}
	}
	return out
}

// Restart restarts child id now: SIGTERM (it saves its sessions), then a
// new start once it exited. It counts no restart attempt.
func (s *Supervisor) Restart(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.byID[id]
	switch {
	case !ok:
		return fmt.Errorf("%w: %q", ErrUnknownChild, id)
	case s.closing:
		return ErrClosed
	case len(s.rollout) > 0:
		return fmt.Errorf("%w: restart all is in progress (child %q)", ErrBusy, s.rollout[0].ID)
	}
	return s.restartLocked(c)
}

// RestartAll restarts the children one at a time, in the assignment's
// order, each after the previous one's shards are all READY again. It
// returns at once; /children shows the progress.
func (s *Supervisor) RestartAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return ErrClosed
	case len(s.rollout) > 0:
		return fmt.Errorf("%w: restart all is in progress (child %q)", ErrBusy, s.rollout[0].ID)
	}
	for _, c := range s.children {
		if c.state == Stopping {
			return fmt.Errorf("%w: child %q is stopping", ErrBusy, c.ID)
		}
	}
	s.rollout = append([]*child(nil), s.children...)
	s.log.Info("restarting every child, one at a time", "children", len(s.rollout))
	return s.nextRolloutLocked()
}

func (s *Supervisor) nextRolloutLocked() error {
	for len(s.rollout) > 0 {
		c := s.rollout[0]
		if c.state == Failed || c.state == Closed {
			s.rollout = s.rollout[1:]
			continue
		}
		return s.restartLocked(c)
	}
	s.log.Info("restart all done")
	return nil
}

func (s *Supervisor) restartLocked(c *child) error {
	switch c.state {
	case Stopping:
		return fmt.Errorf("%w: child %q is stopping", ErrBusy, c.ID)
	case Failed, Closed:
		return fmt.Errorf("%w: child %q is %s", ErrBusy, c.ID, c.state)
	case Restarting, Idle:
		s.log.Info("restarting child now", "child", c.ID, "state", c.state)
		s.stopTimerLocked(c)
		s.startLocked(c, 0)
		return nil
	}
	s.log.Info("restarting child: stopping it first, its sessions saved", "child", c.ID, "pid", c.proc.Pid())
	s.stopLocked(c, exitRestart)
	return nil
}

// startLocked launches c; attempt as in Launch.
func (s *Supervisor) startLocked(c *child, attempt int) {
	if c.gen > 0 {
		c.restarts++
	}
	c.gen++
	s.moveLocked(c, Starting)
	c.settled, c.socket, c.intent, c.forced = false, "", exitFailure, false
	p, err := s.cfg.Launch(Launch{ID: c.ID, Shards: c.Shards, Generation: c.gen, Attempt: attempt, Crashed: c.crashed}, &Reports{s: s, c: c, gen: c.gen})
	if err != nil {
		s.log.Error("starting child failed", "child", c.ID, "generation", c.gen, "err", err)
		c.lastExit = "not started: " + err.Error()
		s.failureLocked(c)
		return
	}
	c.proc = p
	s.log.Info("child started", "child", c.ID, "pid", p.Pid(), "generation", c.gen, "attempt", attempt)
	gen := c.gen
	s.setTimerLocked(c, s.pol.StartupTimeout, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen == gen && c.state == Starting {
			s.log.Error("child startup timeout: not ready in time; stopping it", "child", c.ID, "pid", c.proc.Pid(), "timeout", s.pol.StartupTimeout)
			s.stopLocked(c, exitFailure)
		}
	})
}

func (s *Supervisor) readyLocked(c *child, socket string) {
	if c.state != Starting {
		return
	}
	s.moveLocked(c, Running)
	c.socket = socket
	s.log.Info("child ready", "child", c.ID, "pid", c.proc.Pid(), "generation", c.gen)
	gen := c.gen
	s.setTimerLocked(c, s.pol.HealthyReset, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen == gen && c.state == Running && c.attempts > 0 {
			s.log.Info("child healthy: restart budget reset", "child", c.ID, "after", s.pol.HealthyReset)
			c.attempts = 0
		}
	})
	if len(s.rollout) > 0 && s.rollout[0] == c && !c.settled {
		// The rollout goes on only once the shards are READY; a child
		// whose shards do not get there in time stops it, so that a bad
		// deploy breaks one child, not all.
		s.setKillerLocked(c, s.pol.StartupTimeout, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if c.gen == gen && len(s.rollout) > 0 && s.rollout[0] == c && !c.settled {
				var left []string
				for _, o := range s.rollout[1:] {
					left = append(left, o.ID)
				}
				s.log.Error("restart all stopped: the child's shards are not all READY in time; the rest were not restarted", "child", c.ID, "timeout", s.pol.StartupTimeout, "not_restarted", left)
				s.rollout = nil
			}
		})
	}
	if c.settled {
		s.settledLocked(c)
	}
}

func (s *Supervisor) settledLocked(c *child) {
	if c.state != Running || len(s.rollout) == 0 || s.rollout[0] != c {
		return
	}
	if c.killer != nil {
		c.killer.Stop()
		c.killer = nil
	}
	s.log.Info("child's shards are READY", "child", c.ID, "generation", c.gen)
	s.rollout = s.rollout[1:]
	if err := s.nextRolloutLocked(); err != nil {
		s.log.Error("restart all stopped", "err", err)
		s.rollout = nil
	}
}

// stopLocked asks c's process to exit, and kills it after the shutdown
// timeout.
func (s *Supervisor) stopLocked(c *child, why intent) {
	c.intent = why
	if c.state == Stopping {
		return
	}
	s.moveLocked(c, Stopping)
	s.stopTimerLocked(c)
	p, gen := c.proc, c.gen
	if err := p.Signal(syscall.SIGTERM); err != nil {
		s.log.Warn("signalling child", "child", c.ID, "pid", p.Pid(), "signal", "SIGTERM", "err", err)
	}
	s.setKillerLocked(c, s.pol.ShutdownTimeout, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen == gen && c.proc != nil {
			s.log.Error("forced termination: the child did not exit after SIGTERM; sending SIGKILL", "child", c.ID, "pid", p.Pid(), "timeout", s.pol.ShutdownTimeout)
			c.forced = true
			if err := p.Signal(syscall.SIGKILL); err != nil {
				s.log.Warn("signalling child", "child", c.ID, "pid", p.Pid(), "signal", "SIGKILL", "err", err)
			}
		}
	})
}

func (s *Supervisor) exitedLocked(c *child, err error) {
	c.lastExit = exitText(err)
	c.proc = nil
	// Only a stop this supervisor asked for (restart or close), and that
	// needed no SIGKILL, is clean.
	c.crashed = c.intent == exitFailure || c.forced
	s.stopTimerLocked(c)
	was := c.state
	switch {
	case c.intent == exitClose || s.closing:
		s.moveLocked(c, Closed)
		s.log.Info("child stopped", "child", c.ID, "exit", c.lastExit)
		s.checkDoneLocked()
	case c.intent == exitRestart:
		s.log.Info("child stopped for its restart", "child", c.ID, "exit", c.lastExit)
		s.startLocked(c, 0)
	default:
		s.log.Warn("child exited unexpectedly", "child", c.ID, "state", was, "exit", c.lastExit)
		s.failureLocked(c)
	}
}

// failureLocked applies the restart policy to c, which just failed.
func (s *Supervisor) failureLocked(c *child) {
	c.proc = nil
	if s.closing {
		s.moveLocked(c, Closed)
		s.checkDoneLocked()
		return
	}
	if c.attempts >= s.pol.MaxAttempts {
		s.moveLocked(c, Failed)
		if s.pol.MaxAttempts == 0 {
			s.err = fmt.Errorf("child %q exited unexpectedly (%s) and --restart-max is 0", c.ID, c.lastExit)
		} else {
			s.err = fmt.Errorf("child %q failed: restarted %d times in a row, last exit: %s", c.ID, c.attempts, c.lastExit)
		}
		s.log.Error("restart budget exhausted: stopping every child", "child", c.ID, "attempts", c.attempts, "max", s.pol.MaxAttempts, "last_exit", c.lastExit)
		s.closeAllLocked()
		return
	}
	c.attempts++
	d := s.pol.Delay(c.attempts)
	s.moveLocked(c, Restarting)
	s.log.Warn("restarting child", "child", c.ID, "attempt", c.attempts, "max", s.pol.MaxAttempts, "delay", d, "last_exit", c.lastExit)
	gen, attempt := c.gen, c.attempts
	s.setTimerLocked(c, d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen == gen && c.state == Restarting {
			s.startLocked(c, attempt)
		}
	})
}

func (s *Supervisor) closeAllLocked() {
	if s.closing {
		return
	}
	s.closing = true
	s.rollout = nil
	for _, c := range s.children {
		switch c.state {
		case Starting, Running:
			s.stopLocked(c, exitClose)
		case Stopping:
			c.intent = exitClose
		case Idle, Restarting:
			s.stopTimerLocked(c)
			s.moveLocked(c, Closed)
		}
	}
	s.checkDoneLocked()
}

func (s *Supervisor) checkDoneLocked() {
	if !s.closing {
		return
	}
	for _, c := range s.children {
		if c.proc != nil {
			return
		}
	}
	s.doneOnce.Do(func() { close(s.done) })
}

func (s *Supervisor) setTimerLocked(c *child, d time.Duration, f func()) {
	s.stopTimerLocked(c)
	c.timer = s.clock.AfterFunc(d, f)
}

func (s *Supervisor) setKillerLocked(c *child, d time.Duration, f func()) {
	if c.killer != nil {
		c.killer.Stop()
	}
	c.killer = s.clock.AfterFunc(d, f)
}

func (s *Supervisor) stopTimerLocked(c *child) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.killer != nil {
		c.killer.Stop()
		c.killer = nil
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
