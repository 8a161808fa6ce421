package core

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// eventLine builds one logfmt line of the events logs, time first:
//
//	ts=2026-11-30T07:00:00.123Z shard=3 event=backoff state=BACKOFF reconnects=4 err="..." tcp=failed tls=none ws=closed
//
// A node-level line has no shard key:
//
//	ts=2026-11-30T07:00:00.123Z event=rejected cmd="frob all" err="..."
//
// The same pairs go to the node's slog logger.
type eventLine struct {
	b      []byte
	attrs  []slog.Attr
	level  slog.Level
	event  string
	logged bool // attrs are collected only when the logger wants the line
}

var linePool = sync.Pool{New: func() any { return &eventLine{b: make([]byte, 0, 256)} }}

func newEventLine(now time.Time, shard int, event string, level slog.Level, log *slog.Logger) *eventLine {
	e := linePool.Get().(*eventLine)
	e.b, e.attrs, e.level, e.event = e.b[:0], e.attrs[:0], level, event
	e.logged = log != nil && log.Enabled(context.Background(), level)
	e.b = append(e.b, "ts="...)
	e.b = now.UTC().AppendFormat(e.b, "2006-01-02T15:04:05.000Z07:00")
	// A node-level line (shard -1: the node's ctl, a discovery's budget
	// mark) has no shard key rather than a shard that does not exist.
	if shard >= 0 {
		e.b = append(e.b, " shard="...)
		e.b = strconv.AppendInt(e.b, int64(shard), 10)
	}
	e.b = append(e.b, " event="...)
	e.b = append(e.b, event...)
	if e.logged && shard >= 0 {
		e.attrs = append(e.attrs, slog.Int("shard", shard))
	}
	return e
}

func (e *eventLine) str(k, v string) *eventLine {
	e.b = append(e.b, ' ')
	e.b = append(e.b, k...)
	e.b = append(e.b, '=')
	e.b = appendLogfmtValue(e.b, v)
	if e.logged {
		e.attrs = append(e.attrs, slog.String(k, v))
	}
	return e
}

func (e *eventLine) int(k string, v int64) *eventLine {
	e.b = append(e.b, ' ')
	e.b = append(e.b, k...)
	e.b = append(e.b, '=')
	e.b = strconv.AppendInt(e.b, v, 10)
	if e.logged {
		e.attrs = append(e.attrs, slog.Int64(k, v))
	}
	return e
}

func (e *eventLine) err(err error) *eventLine {
	if err == nil {
		return e.str("err", "none")
	}
	return e.str("err", err.Error())
}

func (e *eventLine) conn(cs ConnState) *eventLine {
	return e.str("tcp", cs.TCP.String()).str("tls", cs.TLS.String()).str("ws", cs.WS.String())
}

// finish returns the line with its newline, logs it when the logger wants
// it, and recycles e: the bytes are valid until the next newEventLine.
func (e *eventLine) finish(l *slog.Logger) []byte {
	if e.logged {
		l.LogAttrs(context.Background(), e.level, e.event, e.attrs...)
	}
	e.b = append(e.b, '\n')
	return e.b
}

func (e *eventLine) release() {
	clear(e.attrs)
	linePool.Put(e)
}

// appendLogfmtValue quotes v when logfmt needs it: empty, or holding a
// space, a quote, an equals sign or anything unprintable.
func appendLogfmtValue(b []byte, v string) []byte {
	if v == "" {
		return append(b, `""`...)
	}
	for _, r := range v {
		if r <= ' ' || r == '"' || r == '=' || r == '\\' || r == utf8.RuneError || r == 0x7f {
			return strconv.AppendQuote(b, v)
		}
	}
	return append(b, v...)
}
