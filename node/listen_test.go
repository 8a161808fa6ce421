package node

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// servingParent tells when Run serves its tree.
type servingParent struct{ serving chan string }

func (p servingParent) Configure(*Config) {}
func (p servingParent) Starting(n *Node)  {}
func (p servingParent) Serving(ctx context.Context, n *Node, socket string) {
	p.serving <- socket
}

// lockedBuilder is a log any goroutine may write.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An optional listener (serve's default loopback TCP) whose port another
// user holds does not stop Run: the node serves on its unix socket and
// the log names the listener left out. Before, Run failed on it.
func TestRunOptionalListenerHeld(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, port, _ := net.SplitHostPort(held.Addr().String())
	sim, err := gatewaysim.New(gatewaysim.Config{Token: "OPT-TOKEN", Shards: 1, MaxConcurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sock := filepath.Join(t.TempDir(), "node.sock")
	var logb lockedBuilder
	p := servingParent{serving: make(chan string, 1)}
	rc := RunConfig{
		Config: Config{Flavor: core.Discord, Token: "OPT-TOKEN", GatewayURL: sim.GatewayURL(), MaxConcurrency: 1},
		Total:  1, Listen: []string{"unix!" + sock}, ListenOptional: []string{"tcp!127.0.0.1!" + port + ",ro"},
		Parent: p,
	}
	rc.Logger = slog.New(slog.NewTextHandler(&logb, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, rc) }()
	select {
	case got := <-p.serving:
		if got != sock {
			t.Errorf("Run serves on %q; want %q", got, sock)
		}
	case err := <-done:
		t.Fatalf("Run with its optional listener's port held = %v; want it serving", err)
	case <-time.After(time.Minute): // a bound on a hang only
		cancel()
		t.Fatal("Run did not serve within a minute")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after its context ended; want nil", err)
	}
	if s := logb.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "tcp!127.0.0.1!"+port+",ro") {
		t.Errorf("Run's log does not name the listener left out:\n%s", s)
	}
}
