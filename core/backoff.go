package core

import (
	"fmt"
	"strings"
	"time"
)

// BackoffPolicy decides how long a shard waits before reconnecting.
type BackoffPolicy interface {
	// Delay returns the wait after the failures-th consecutive failure
	// (1-based). resumable says whether the session can be resumed; r is
	// uniform in [0, 1) and drives jitter.
	Delay(failures int, resumable bool, r float64) time.Duration
}

// Exponential doubles the delay per consecutive failure from First up to
// Max, then spreads it by ±Jitter (0.5 = ±50%) so that shards that failed
// together do not retry together. The result never exceeds Max.
//
// With Resume set, the first failure of a resumable session waits Resume×r
// instead (full jitter): a resume costs no identify budget, the gateway
// keeps the session only for a few minutes (Fluxer: 60 s), and a mass drop
// of thousands of shards is still spread over Resume (the transport also
// bounds how many dial at once). Later failures back off exponentially as
// usual.
type Exponential struct {
	First, Max time.Duration
	Jitter     float64
	Resume     time.Duration
}

// DefaultBackoff is the policy of DESIGN.md section 2, 5 s doubling to
// 10 min, ±50%, plus a first resume within 100 ms: about what a
// gateway library does (they resume at once), spread just enough that a
// node's shards do not all dial in the same instant. The cap keeps a day-long
// outage well under Discord's 1,000 identifies a day.
var DefaultBackoff = Exponential{First: 5 * time.Second, Max: 10 * time.Minute, Jitter: 0.5, Resume: 100 * time.Millisecond}

// Delay implements BackoffPolicy.
func (e Exponential) Delay(failures int, resumable bool, r float64) time.Duration {
	if e.Resume > 0 && resumable && failures <= 1 {
		return time.Duration(float64(e.Resume) * r)
	}
	d := e.First
	for i := 1; i < failures && d < e.Max; i++ {
		d *= 2
	}
	d = min(d, e.Max)
	d = time.Duration(float64(d) * (1 + e.Jitter*(2*r-1)))
	return min(max(d, 0), e.Max)
}

// Fixed waits the same time after every failure: the bare-metal behaviour.
type Fixed time.Duration

// Delay implements BackoffPolicy.
func (f Fixed) Delay(int, bool, float64) time.Duration { return time.Duration(f) }

// ParseBackoff reads a policy: "default" or "fixed:DURATION".
func ParseBackoff(s string) (BackoffPolicy, error) {
	if s == "" || s == "default" {
		return DefaultBackoff, nil
	}
	if rest, ok := strings.CutPrefix(s, "fixed:"); ok {
		d, err := time.ParseDuration(rest)
		if err == nil && d > 0 && d <= time.Hour {
			return Fixed(d), nil
		}
		return nil, fmt.Errorf("%w: backoff %q: the delay must be a duration in (0, 1h]; usage: default | fixed:5s", ErrUsage, s)
	}
	return nil, fmt.Errorf("%w: unknown backoff %q; usage: default | fixed:5s", ErrUsage, s)
}
