package core

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/clock"
)

// maxLoggedCommand is how much of a refused command its events line shows:
// enough to recognise it, never a 64 KiB write copied into every log.
const maxLoggedCommand = 128

// A refusal's events line is at most maxRejectedLine bytes, whatever was
// written: the command is clipped to maxLoggedCommand bytes and then, like
// the error, to what its escaped form may take in the line, and the error
// keeps at least minLoggedError bytes for the reason. The error quotes the
// offending word again; that copy is clipped to maxLoggedWord.
const (
	maxRejectedLine = 256
	minLoggedError  = 60
	maxLoggedWord   = 28
)

// clip shortens s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// clipLogfmt returns the longest clip of s whose logfmt form, quoted and
// escaped, takes at most limit bytes: escaping can make a byte four.
func clipLogfmt(s string, limit int) string {
	var buf [maxRejectedLine + 8]byte
	return clipFit(s, limit, func(v string) int { return len(appendLogfmtValue(buf[:0], v)) })
}

// clipFit returns the longest clip of s whose size is at most limit; size
// never shrinks as a clip grows.
func clipFit(s string, limit int, size func(string) int) string {
	if len(s) <= limit && size(s) <= limit {
		return s
	}
	lo, hi := 0, min(len(s), limit) // clip(s, lo) fits, or lo is 0
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if size(clip(s, mid)) <= limit {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return clip(s, lo)
}

// rejectReason is the error text of a refusal's events line. A
// CommandError quotes the offending word, which can be the whole junk
// line: the line shows it in cmd= already, so the error's copy is clipped
// to maxLoggedWord bytes as it will appear, quoted by the error and again
// by logfmt, and the reason after it survives the clip.
func rejectReason(err error) string {
	var ce *CommandError
	if !errors.As(err, &ce) {
		return err.Error()
	}
	var buf [4 * maxLoggedWord]byte
	short := *ce
	short.Word = clipFit(ce.Word, maxLoggedWord, func(v string) int {
		return len(appendLogfmtValue(buf[:0], strconv.Quote(v)))
	})
	return short.Error()
}

// Reject logs a refused line of the node's /ctl that a command outside
// the core refused (the tree's Command hook: drain, reshard), as the
// core logs its own: an event=rejected line in the node's events with the
// clipped command and the reason, under the same rate limit. A client
// over 9P2000.L, whose errors carry an errno alone, finds the reason
// there.
func (n *Scheduler) Reject(line string, err error) { n.reject(nil, line, err) }

// reject logs a refused command, clipped, with the reason, unless the
// shard (or the node's ctl) has had its burst of refusal lines in this
// window; see rejectLimiter.
func (n *Scheduler) reject(s *shard, line string, err error) {
	id := -1
	if s != nil {
		id = s.id
	}
	now := n.clock.Now()
	if !n.rejects.admit(n, s, id, now) {
		return
	}
	e := newEventLine(now, id, "rejected", slog.LevelWarn, n.log)
	room := maxRejectedLine - len(e.b) - len(" cmd= err=\n")
	e.str("cmd", clipLogfmt(clip(line, maxLoggedCommand), room-minLoggedError))
	e.str("err", clipLogfmt(rejectReason(err), maxRejectedLine-len(e.b)-len(" err=\n")))
	n.logReject(s, e, now)
}

func (n *Scheduler) logReject(s *shard, e *eventLine, now time.Time) {
	b := e.finish(n.log)
	if s != nil {
		s.events.Append(b, now)
	}
	n.events.Append(b, now)
	e.release()
}

// Refusal lines are rate-limited per shard and for the node's ctl, so that
// junk written to a ctl or send file cannot push out of the events logs the
// lines that explain a failure: at most rejectBurst lines per window; the
// refusals past them are counted and summed up in one rejected-suppressed
// line when the window ends. A window in which refusals were suppressed,
// followed at once by more, is followed by one twice as long, up to
// maxRejectWindow, so that junk written without pause costs a few lines an
// hour; a quiet window brings the window back to rejectWindow.
const (
	rejectBurst     = 10
	rejectWindow    = time.Minute
	maxRejectWindow = time.Hour
)

// rejectLimiter holds a window per shard that had a refusal (-1 for the
// node's ctl); shards never refused pay nothing.
type rejectLimiter struct {
	mu   sync.Mutex
	keys map[int]*rejectWindowState
}

type rejectWindowState struct {
	start      time.Time
	window     time.Duration
	logged     int
	suppressed int  // refusals not logged in this window
	escalate   bool // this window suppressed refusals
	timer      clock.Timer
}

// admit reports whether a refusal of shard id (nil s and -1 for the node)
// at now may be logged, and counts it otherwise.
func (l *rejectLimiter) admit(n *Scheduler, s *shard, id int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[int]*rejectWindowState{}
	}
	w := l.keys[id]
	if w == nil {
		w = &rejectWindowState{start: now, window: rejectWindow}
		l.keys[id] = w
	}
	if end := w.start.Add(w.window); !now.Before(end) {
		l.flushLocked(n, s, id, w, now) // in case the summary's timer is late
		if w.escalate && now.Before(end.Add(w.window)) {
			w.window = min(2*w.window, maxRejectWindow)
		} else {
			w.window = rejectWindow
		}
		w.start, w.logged, w.escalate = now, 0, false
	}
	if w.logged < rejectBurst {
		w.logged++
		return true
	}
	if w.suppressed == 0 {
		d := w.start.Add(w.window).Sub(now)
		due := func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.flushLocked(n, s, id, w, n.clock.Now())
		}
		if w.timer == nil {
			w.timer = n.clock.AfterFunc(d, due)
		} else {
			w.timer.Reset(d)
		}
	}
	w.suppressed++
	w.escalate = true
	return false
}

// flushLocked logs how many refusals the window suppressed, if any.
func (l *rejectLimiter) flushLocked(n *Scheduler, s *shard, id int, w *rejectWindowState, now time.Time) {
	if w.suppressed == 0 {
		return
	}
	e := newEventLine(now, id, "rejected-suppressed", slog.LevelWarn, n.log).
		int("suppressed", int64(w.suppressed)).str("window", w.window.String())
	w.suppressed = 0
	n.logReject(s, e, now)
}
