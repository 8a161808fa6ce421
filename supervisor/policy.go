package supervisor

import "time"

// Policy is the restart policy, the Fluxerly SDK's supervisor's defaults
// carried over (DESIGN.md section 6 names the flags).
type Policy struct {
	// MaxAttempts is how many times in a row a child that exits
	// unexpectedly is restarted; the next unexpected exit fails the
	// supervisor. 0: the first unexpected exit does.
	MaxAttempts int
	// MinDelay is the wait before the first restart of a run; it doubles
	// with each further attempt, up to MaxDelay.
	MinDelay, MaxDelay time.Duration
	// HealthyReset: a child that has been running that long gets its
	// whole budget of attempts back.
	HealthyReset time.Duration
	// StartupTimeout bounds the time from the start of a child to its
	// readiness; past it the child is stopped and counts as a failure.
	StartupTimeout time.Duration
	// ShutdownTimeout is how long a child has to exit after SIGTERM
	// before it is killed.
	ShutdownTimeout time.Duration
	// Watchdog: a running child silent on its control stream that long
	// is hung, killed and restarted (0: no watchdog). A child reports
	// every second.
	Watchdog time.Duration
	// FailAll is the SDK's rule: a child that uses up its budget stops
	// every child and fails the supervisor. Without it, that child is
	// failed alone and the others go on.
	FailAll bool
}

// DefaultPolicy is the SDK's, but for the stop: 3 attempts, 1 s doubling
// to 30 s, the budget back after 60 s, 30 s to start; 20 s to stop, where
// the SDK gave 5 s: a child's clean stop (every shard closed 4000 and
// saved, its last lines flushed) takes up to about 17 s, and a child
// killed before it saved is a crash, whose shards re-identify. The
// watchdog is 10 s; one child that fails is failed alone.
var DefaultPolicy = Policy{
	MaxAttempts: 3, MinDelay: time.Second, MaxDelay: 30 * time.Second,
	HealthyReset: time.Minute, StartupTimeout: 30 * time.Second, ShutdownTimeout: 20 * time.Second,
	Watchdog: 10 * time.Second,
}

// Delay returns the wait before restart attempt n (1-based).
func (p Policy) Delay(n int) time.Duration {
	d := p.MinDelay
	for i := 1; i < n && d < p.MaxDelay; i++ {
		d *= 2
	}
	return min(d, p.MaxDelay)
}
