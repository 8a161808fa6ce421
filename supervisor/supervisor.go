package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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
	Hung       State = "hung"       // silent past the watchdog: killed, waiting for its exit
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

// Alive reports that the child spoke on its control stream: the
// watchdog's sign of life.
func (r *Reports) Alive() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen == r.gen {
		r.c.heard = r.s.clock.Now()
	}
}

// Broken reports that the child's private channel failed (garbage, or
// closed while the process lives): the child cannot be driven, so it is
// stopped and counts as a failure.
func (r *Reports) Broken(err error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.c.gen != r.gen || r.c.proc == nil || r.c.state == Stopping || r.c.state == Hung {
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
	// lastExitWord is lastExit for /children (see ChildInfo).
	lastExitWord string
	crashed      bool // the last process ended without a clean stop
	forced       bool // the current process was sent SIGKILL
	socket       string
	settled      bool
	heard        time.Time   // the last message on its control stream
	watch        clock.Timer // the watchdog, while running
	hangs        int
	intent       intent
	timer        clock.Timer // the state's one timer: startup, healthy reset, restart delay or kill
	killer       clock.Timer
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
	// LastExit says how its last process ended, in words; LastExitWord
	// in one word for /children ("none" before any exit): exit:N,
	// signal:NAME, watchdog:SIGKILL (hung), shutdown-timeout:SIGKILL (did
	// not stop in time), not-started.
	LastExit     string
	LastExitWord string
	// Hangs counts the watchdog's kills of it.
	Hangs int
	// Silent is how long ago its process (Pid) last spoke on its
	// control stream, or started: it pushes its shards' states at least
	// every second, so this is the age of what the parent shows of them.
	Silent time.Duration
}

// String is the /children line: id state pid restarts generation shards
// last_exit silent (seconds since its last push, "s" after them, or none
// without a process).
func (c ChildInfo) String() string {
	silent := "none"
	if c.Pid != 0 {
		silent = strconv.FormatFloat(c.Silent.Seconds(), 'f', 1, 64) + "s"
	}
	return c.fields() + " " + silent
}

func (c ChildInfo) fields() string {
	pid := "none"
	if c.Pid != 0 {
		pid = strconv.Itoa(c.Pid)
	}
	last := c.LastExitWord
	if last == "" {
		last = "none"
	}
	return fmt.Sprintf("%s %s %s %d %d %s %s", c.ID, c.State, pid, c.Restarts, c.Generation, FormatShards(c.Shards), last)
}

// exitWord is how a process ended, in one word; killedBy names who sent
// the SIGKILL it died of, if the supervisor did.
func exitWord(err error, killedBy string) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit:0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			if ws.Signal() == syscall.SIGKILL && killedBy != "" {
				return killedBy + ":SIGKILL"
			}
			return "signal:" + unix.SignalName(ws.Signal())
		}
		return "exit:" + strconv.Itoa(ee.ExitCode())
	}
	return strings.Join(strings.Fields(err.Error()), "_")
}

// cleanExit: a process that exited with status 0. Anything else (a
// status, a signal) is a crash, whatever the supervisor asked for: the
// child may have saved sessions past what the parent has.
func cleanExit(err error) bool { return err == nil }

// Children returns every child's line, in the assignment's order.
func (s *Supervisor) Children() []ChildInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ChildInfo, len(s.children))
	for i, c := range s.children {
		out[i] = s.infoLocked(c)
	}
	return out
}

// Child returns the line of the assignment's child i.
func (s *Supervisor) Child(i int) ChildInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.infoLocked(s.children[i])
}

func (s *Supervisor) infoLocked(c *child) ChildInfo {
	info := ChildInfo{ID: c.ID, State: c.state, Restarts: c.restarts, Generation: c.gen, Shards: c.Shards, Socket: c.socket, LastExit: c.lastExit, LastExitWord: c.lastExitWord, Hangs: c.hangs}
	if c.proc != nil {
		info.Pid = c.proc.Pid()
		info.Silent = max(s.clock.Now().Sub(c.heard), 0)
	}
	return info
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
		if c.state == Stopping || c.state == Hung {
			return fmt.Errorf("%w: child %q is %s", ErrBusy, c.ID, c.state)
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
	case Stopping, Hung:
		return fmt.Errorf("%w: child %q is %s", ErrBusy, c.ID, c.state)
	case Closed:
		return fmt.Errorf("%w: child %q is %s", ErrBusy, c.ID, c.state)
	case Failed:
		// What the log line of its failure told the operator to do: a
		// new restart budget, the shards back on a child.
		s.log.Info("restarting a failed child: its restart budget starts again", "child", c.ID, "last_exit", c.lastExit)
		c.attempts = 0
		s.startLocked(c, 0)
		return nil
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
		c.lastExit, c.lastExitWord = "not started: "+err.Error(), "not-started"
		s.failureLocked(c)
		return
	}
	c.proc, c.heard = p, s.clock.Now()
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
	c.heard = s.clock.Now()
	if c.timer != nil {
		c.timer.Stop() // the startup timeout
		c.timer = nil
	}
	s.watchLocked(c, gen, s.pol.Watchdog)
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

// watchdogLate is how late the watchdog's timer may fire before the
// silence it sees is taken for the parent's own stall, not the child's.
const watchdogLate = time.Second

// watchLocked arms c's watchdog to look in d: a running child silent on
// its control stream for the watchdog's time is hung, killed, and goes to
// the restart policy. A child that reports pushes at least every second.
func (s *Supervisor) watchLocked(c *child, gen int, d time.Duration) {
	if s.pol.Watchdog <= 0 {
		return
	}
	if c.watch != nil {
		c.watch.Stop()
	}
	due := s.clock.Now().Add(d)
	c.watch = s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen != gen || c.state != Running {
			return
		}
		now := s.clock.Now()
		if late := now.Sub(due); late > watchdogLate {
			// The parent itself was stopped (SIGSTOP, a frozen cgroup, a
			// paused VM): the children's pushes wait unread in their
			// sockets, and their silence is the parent's. Judge again a
			// whole watchdog from now, once the readers have caught up.
			s.log.Warn("watchdog fired late: the parent itself was stalled; judging the child again later", "child", c.ID, "late", late)
			s.watchLocked(c, gen, s.pol.Watchdog)
			return
		}
		silent := now.Sub(c.heard)
		if silent < s.pol.Watchdog {
			s.watchLocked(c, gen, s.pol.Watchdog-silent)
			return
		}
		s.hungLocked(c, silent)
	})
}

// hungLocked kills c, silent for that long. Its exit is a crash: the
// restart policy decides, and its snapshots are not trusted.
func (s *Supervisor) hungLocked(c *child, silent time.Duration) {
	p := c.proc
	s.log.Error("child hung: silent on its channel past the watchdog; killing it", "child", c.ID, "pid", p.Pid(), "silent", silent, "watchdog", s.pol.Watchdog)
	s.stopTimerLocked(c)
	s.moveLocked(c, Hung)
	c.hangs++
	c.intent, c.forced = exitFailure, true
	if err := p.Signal(syscall.SIGKILL); err != nil {
		s.log.Warn("signalling child", "child", c.ID, "pid", p.Pid(), "signal", "SIGKILL", "err", err)
	}
}

func (s *Supervisor) settledLocked(c *child) {
	if c.state != Running {
		return
	}
	// The healthy reset counts from every shard READY, not from the
	// tree served: a child whose shards never get there (a crash caused
	// by an event, replayed at each start) keeps its count.
	gen := c.gen
	s.setTimerLocked(c, s.pol.HealthyReset, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.gen == gen && c.state == Running && c.attempts > 0 {
			s.log.Info("child healthy: restart budget reset", "child", c.ID, "after", s.pol.HealthyReset)
			c.attempts = 0
		}
	})
	if len(s.rollout) == 0 || s.rollout[0] != c {
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
	killedBy := ""
	switch {
	case c.state == Hung:
		killedBy = "watchdog"
	case c.forced:
		killedBy = "shutdown-timeout"
	}
	c.lastExit, c.lastExitWord = exitText(err), exitWord(err, killedBy)
	c.proc = nil
	// Only a stop this supervisor asked for (restart or close), that
	// needed no SIGKILL and ended with status 0, is clean: a child that
	// crashed while it stopped may have saved sessions past the parent's
	// last line.
	c.crashed = c.intent == exitFailure || c.forced || !cleanExit(err)
	s.stopTimerLocked(c)
	was := c.state
	switch {
	case c.intent == exitClose || s.closing:
		s.moveLocked(c, Closed)
		if c.crashed {
			s.log.Warn("child stopped, but not cleanly: its snapshots are not trusted", "child", c.ID, "exit", c.lastExit)
		} else {
			s.log.Info("child stopped", "child", c.ID, "exit", c.lastExit)
		}
		s.checkDoneLocked()
	case c.intent == exitRestart:
		if c.crashed {
			s.log.Warn("child crashed while it stopped for its restart: its snapshots are not trusted", "child", c.ID, "exit", c.lastExit)
		} else {
			s.log.Info("child stopped for its restart", "child", c.ID, "exit", c.lastExit)
		}
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
		var err error
		if s.pol.MaxAttempts == 0 {
			err = fmt.Errorf("child %q exited unexpectedly (%s) and --restart-max is 0", c.ID, c.lastExit)
		} else {
			err = fmt.Errorf("child %q failed: restarted %d times in a row, last exit: %s", c.ID, c.attempts, c.lastExit)
		}
		if s.pol.FailAll {
			s.err = err
			s.log.Error("restart budget exhausted: stopping every child (--fail-all)", "child", c.ID, "attempts", c.attempts, "max", s.pol.MaxAttempts, "last_exit", c.lastExit)
			s.closeAllLocked()
			return
		}
		for _, o := range s.children {
			if o.state != Failed {
				s.log.Error("restart budget exhausted: the child is failed, the others go on (its shards run nowhere until restart "+c.ID+")", "child", c.ID, "attempts", c.attempts, "max", s.pol.MaxAttempts, "last_exit", c.lastExit)
				return
			}
		}
		// Every child failed: nothing is left to supervise.
		s.err = err
		s.log.Error("restart budget exhausted: every child is failed", "child", c.ID, "attempts", c.attempts, "max", s.pol.MaxAttempts, "last_exit", c.lastExit)
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
		case Stopping, Hung:
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

// setTimerLocked sets c's state timer (startup, healthy reset or restart
// delay), replacing the one set.
func (s *Supervisor) setTimerLocked(c *child, d time.Duration, f func()) {
	if c.timer != nil {
		c.timer.Stop()
	}
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
	if c.watch != nil {
		c.watch.Stop()
		c.watch = nil
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
