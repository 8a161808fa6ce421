package main

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// blockingWriter stands for a stderr nobody drains until release.
type blockingWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	release chan struct{}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// Logging never waits for a stuck stderr: lines beyond the queue are
// dropped and counted, and the rest come out in order once it drains.
func TestAsyncLogNeverBlocks(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	h, stop := newAsyncHandler(slog.NewTextHandler(w, nil), 4, nil)
	log := slog.New(h).With("component", "core")
	for i := range 100 {
		log.Info("event", "n", i) // would hang here if Handle waited
	}
	close(w.release)
	stop()
	out := w.buf.String()
	if !strings.Contains(out, "component=core msg=event n=0") && !strings.Contains(out, "msg=event component=core n=0") {
		t.Errorf("the first line is missing:\n%s", out)
	}
	if !strings.Contains(out, "log lines dropped") {
		t.Errorf("no report of the dropped lines:\n%s", out)
	}
	if n := strings.Count(out, "msg=event"); n < 4 || n > 6 {
		t.Errorf("%d lines came out; want the queue's 4 (plus the one being written)", n)
	}
	log.Info("after stop") // dropped, no panic
}
