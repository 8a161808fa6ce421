// Package refusal keeps the events lines that record refused writes
// bounded in number and free of what was written.
//
// A refused line written to a ctl or send file is logged by its command
// word (or op number) and its length, never its content: the default
// read-only listener serves events to every local user, and a
// hand-written resume carrying the token, or a token pasted into ctl by
// mistake, fits in a line. The reason is the refusal's own text with the
// writer's words left out; the writer got the whole error from its write.
//
// Refusal lines are rate-limited per key (a shard, or the node's own ctl)
// and node-wide, so that junk written to one file, or to every shard's
// file at once, cannot push the lines that explain a failure out of the
// events logs: see Limiter.
package refusal

import (
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/clock"
)

// Unknown is the word a refusal line shows for a line whose first word
// is no command of the file: that word is the writer's content.
const Unknown = "?"

// MaxWord bounds the command word a refusal line shows.
const MaxWord = 28

// Word returns what a refusal line shows of line's command: its first
// word when known (the file took it for one of its commands), clipped to
// MaxWord bytes, else Unknown.
func Word(line string, known bool) string {
	f := strings.Fields(line)
	if !known || len(f) == 0 || !printable(f[0]) {
		return Unknown
	}
	return Clip(f[0], MaxWord)
}

func printable(s string) bool {
	for _, r := range s {
		if r < '!' || r > '~' {
			return false
		}
	}
	return true
}

// Clip shortens s to at most n bytes, on a rune boundary, marking the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// Elide returns an error text with every quoted part (where an error
// quotes the writer's words, with %q) replaced by "...".
func Elide(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexAny(s, "\"`")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		q, err := strconv.QuotedPrefix(s[i:])
		if err != nil { // an unmatched quote: the rest may be content
			b.WriteString(`"..."`)
			return b.String()
		}
		b.WriteString(`"..."`)
		s = s[i+len(q):]
	}
}

// The limits of refusal lines: at most Burst lines per key and
// NodeBurst lines node-wide in a window; the refusals past them are
// counted and summed up in one line when the window ends. A window in
// which refusals were suppressed, followed at once by more, is followed
// by one twice as long, up to MaxWindow, so that junk written without
// pause costs a few lines an hour; a quiet window brings the window back
// to Window.
const (
	Burst     = 10
	NodeBurst = 100
	Window    = time.Minute
	MaxWindow = time.Hour
)

// All is the key Limiter.Flush gets for the node-wide summary.
const All = -1 << 31

// Limiter decides which refusals are logged, and where. Keys are the
// caller's (a shard id, -1 for the node's ctl); a key never refused costs
// nothing. A key's own log (a shard's events) takes at most Burst lines a
// window; the node's log, which every key's lines also go to, takes at
// most NodeBurst a window from all keys together, so a shard's own log
// still explains its refusals when junk reaches every shard at once.
type Limiter struct {
	// Clock times the windows and the summaries.
	Clock clock.Clock
	// Flush logs a summary of suppressed refusals in a window of the
	// given length: of key to its own log, and to the node's when node
	// is set; of All (the node-wide budget) to the node's log. It is
	// called with the limiter's lock held and must not call the limiter.
	Flush func(key, suppressed int, window time.Duration, now time.Time, node bool)

	mu   sync.Mutex
	keys map[int]*window
	all  window
}

type window struct {
	start      time.Time
	length     time.Duration
	logged     int
	suppressed int  // refusals not logged in this window
	escalate   bool // this window suppressed refusals
	timer      clock.Timer
}

// Admit reports whether a refusal of key at now may be logged to key's
// own log and to the node's, and counts it where it may not.
func (l *Limiter) Admit(key int, now time.Time) (own, node bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[int]*window{}
	}
	w := l.keys[key]
	if w == nil {
		w = &window{start: now, length: Window}
		l.keys[key] = w
	}
	if !l.admitLocked(key, w, Burst, now) {
		return false, false
	}
	return true, l.admitLocked(All, &l.all, NodeBurst, now)
}

func (l *Limiter) admitLocked(key int, w *window, burst int, now time.Time) bool {
	if w.length == 0 {
		w.start, w.length = now, Window
	}
	if end := w.start.Add(w.length); !now.Before(end) {
		l.flushLocked(key, w, now) // in case the summary's timer is late
		if w.escalate && now.Before(end.Add(w.length)) {
			w.length = min(2*w.length, MaxWindow)
		} else {
			w.length = Window
		}
		w.start, w.logged, w.escalate = now, 0, false
	}
	if w.logged < burst {
		w.logged++
		return true
	}
	if w.suppressed == 0 {
		d := w.start.Add(w.length).Sub(now)
		due := func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.flushLocked(key, w, l.Clock.Now())
		}
		if w.timer == nil {
			w.timer = l.Clock.AfterFunc(d, due)
		} else {
			w.timer.Reset(d)
		}
	}
	w.suppressed++
	w.escalate = true
	return false
}

func (l *Limiter) flushLocked(key int, w *window, now time.Time) {
	if w.suppressed == 0 {
		return
	}
	n := w.suppressed
	w.suppressed = 0
	node := true
	if key != All { // a key's summary is a line of the node's log too
		node = l.admitLocked(All, &l.all, NodeBurst, now)
	}
	l.Flush(key, n, w.length, now, node)
}
