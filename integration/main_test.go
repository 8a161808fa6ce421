package integration

import (
	"io"
	"net"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// QEMU runs this binary for each guest connection to a guestfwd
	// address (tls_test.go), the connection on standard input and output.
	if len(os.Args) == 3 && os.Args[1] == relayArg {
		os.Exit(relayStdio(os.Args[2]))
	}
	goleak.VerifyTestMain(m)
}

// relayArg makes the test binary relay its standard input and output to
// a TCP address: the command of a guestfwd rule, where a host has no
// socat.
const relayArg = "shardfs-test-relay"

func relayStdio(addr string) int {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		os.Stderr.WriteString("relay: " + err.Error() + "\n")
		return 1
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(c, os.Stdin); done <- struct{}{} }()
	go func() { io.Copy(os.Stdout, c); done <- struct{}{} }()
	<-done
	return 0
}
