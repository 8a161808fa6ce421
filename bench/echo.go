package main

import (
	"fmt"
	"io"
	"net"
	"time"
)

// runEcho is the "echo" role: a TCP server that sends back what it reads,
// to measure the loopback round trip between two Go processes that no 9P
// server can beat.
func runEcho([]string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	serveCommands(l.Addr().String(), nil)
	return nil
}

// roundTrip measures the mean time for 16 bytes to go to the echo server
// and back, one exchange after the other, for d.
func roundTrip(addr string, d time.Duration) (time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 16)
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, fmt.Errorf("echo: %w", err)
		}
		n++
	}
	return time.Since(start) / time.Duration(n), nil
}
