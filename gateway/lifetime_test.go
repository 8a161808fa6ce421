package gateway

import "testing"

// A lifetime admits work until close, refuses it afterwards, and wait
// returns only after every admitted piece (an extended one too) left.
func TestLifetime(t *testing.T) {
	var l lifetime
	release := make(chan struct{})
	ran := make(chan struct{})
	if !l.Go(func() { close(ran); <-release }) {
		t.Fatal("Go before close = false; want true")
	}
	<-ran
	if !l.enter() {
		t.Fatal("enter before close = false; want true")
	}
	l.extend() // a parked connection's count, handed over by the holder
	l.leave()

	if !l.close() {
		t.Fatal("first close = false; want true")
	}
	if l.close() {
		t.Error("second close = true; want false")
	}
	if !l.isClosed() {
		t.Error("isClosed after close = false; want true")
	}
	if l.Go(func() { t.Error("a goroutine ran after close") }) {
		t.Error("Go after close = true; want false")
	}
	if l.enter() {
		t.Error("enter after close = true; want false")
	}

	waited := make(chan struct{})
	go func() { l.wait(); close(waited) }()
	close(release)
	select {
	case <-waited:
		t.Fatal("wait returned while the extended count was held")
	default:
	}
	l.leave()
	<-waited
}
