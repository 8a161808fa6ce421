package gatewaysim

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestScale holds GATEWAYSIM_SCALE sessions (16384 for the project's
// target) and reports the simulator's memory and goroutines per session.
// The clients run in a child process, so that the numbers are the server's
// alone and each process stays under the file descriptor limit.
func TestScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("GATEWAYSIM_SCALE"))
	if n <= 0 {
		t.Skip("set GATEWAYSIM_SCALE=16384 to run")
	}
	srv, err := New(Config{
		Shards:            n,
		MaxConcurrency:    n, // every shard its own bucket: identify all at once
		SessionStartLimit: 10 * n,
		HeartbeatInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	before := measure()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestScaleClients$", "-test.v")
	child.Env = append(os.Environ(), "GATEWAYSIM_SCALE_URL="+srv.GatewayURL(), "GATEWAYSIM_SCALE_CLIENTS="+strconv.Itoa(n))
	child.Stderr = os.Stderr
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	start := time.Now()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "ready") {
				ready <- nil
			}
			if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "---") {
				t.Log("child: " + line)
			}
		}
		ready <- fmt.Errorf("child exited before it was ready")
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	if err := srv.Wait(waitCtx, func() bool { return srv.Totals().LiveSessions == int64(n) }); err != nil {
		t.Fatalf("live sessions = %d; want %d", srv.Totals().LiveSessions, n)
	}
	elapsed := time.Since(start)
	after := measure()
	t.Logf("%d sessions live in %v", n, elapsed.Round(time.Millisecond))
	t.Logf("per session: heap %.1f KB, stacks %.1f KB, Go runtime total %.1f KB, RSS %.1f KB, goroutines %.2f",
		float64(after.heap-before.heap)/float64(n)/1024,
		float64(after.stack-before.stack)/float64(n)/1024,
		float64(after.sys-before.sys)/float64(n)/1024,
		float64(after.rss-before.rss)/float64(n)/1024,
		float64(after.goroutines-before.goroutines)/float64(n))
	if st := srv.Totals(); st.MaxLiveSessions != 1 || st.Identifies != int64(n) {
		t.Errorf("Totals() = %+v; want %d identifies, no duplicate", st, n)
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Errorf("client process: %v", err)
	}
	if err := srv.Wait(waitCtx, func() bool { return srv.Connections() == 0 }); err != nil {
		t.Fatalf("connections after the clients left = %d", srv.Connections())
	}
}

type usage struct {
	heap, stack, sys, rss uint64
	goroutines            int
}

func measure() usage {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	u := usage{heap: m.HeapInuse, stack: m.StackInuse, sys: m.Sys - m.HeapReleased, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				u.rss = kb * 1024
			}
		}
	}
	return u
}

// TestScaleClients is the child process of TestScale: it identifies every
// shard, says "ready", and holds the connections until its stdin closes.
func TestScaleClients(t *testing.T) {
	url := os.Getenv("GATEWAYSIM_SCALE_URL")
	n, _ := strconv.Atoi(os.Getenv("GATEWAYSIM_SCALE_CLIENTS"))
	if url == "" || n <= 0 {
		t.Skip("child process of TestScale")
	}
	conns := make([]*websocket.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				ws, err := scaleClient(url, id, n)
				if err != nil {
					errs <- fmt.Errorf("shard %d: %w", id, err)
					continue
				}
				conns[id] = ws
			}
		}()
	}
	for id := range n {
		next <- id
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	for _, ws := range conns {
		ws.Close()
	}
}

func scaleClient(url string, id, total int) (*websocket.Conn, error) {
	d := websocket.Dialer{HandshakeTimeout: time.Minute, ReadBufferSize: 1024, WriteBufferSize: 1024}
	ws, resp, err := d.Dial(url+"?v=10&encoding=json", nil)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	_ = ws.SetReadDeadline(time.Now().Add(time.Minute))
	if _, _, err := ws.ReadMessage(); err != nil {
		ws.Close()
		return nil, err
	}
	identify := fmt.Sprintf(`{"op":2,"d":{"token":"sim-token","intents":1,"shard":[%d,%d],"properties":{"os":"linux","browser":"scale","device":"scale"}}}`, id, total)
	if err := ws.WriteMessage(websocket.TextMessage, []byte(identify)); err != nil {
		ws.Close()
		return nil, err
	}
	for range 2 { // READY and the shard's one GUILD_CREATE
		if _, _, err := ws.ReadMessage(); err != nil {
			ws.Close()
			return nil, err
		}
	}
	return ws, nil
}
