package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/internal/poll"
)

// A metrics address beyond loopback is refused unless it says
// ,insecure; loopback ones are taken.
func TestMetricsListenLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:0", true},
		{"[::1]:0", true},
		{"localhost:0", true},
		{":0", false},
		{"0.0.0.0:0", false},
		{"0.0.0.0:0,insecure", true},
		{"127.0.0.1:0,ro", false},
		{"127.0.0.1", false},
	} {
		l, err := listenMetrics(tc.addr)
		if l != nil {
			l.Close()
		}
		if ok := err == nil; ok != tc.ok {
			if tc.addr == "[::1]:0" && err != nil && !strings.Contains(err.Error(), "insecure") {
				continue // a machine without IPv6
			}
			t.Errorf("listenMetrics(%q) = %v; want ok %t", tc.addr, err, tc.ok)
		}
	}
	if _, err := listenMetrics("0.0.0.0:0"); !errors.Is(err, ErrMetricsInsecure) {
		t.Errorf("listenMetrics(0.0.0.0:0) = %v; want ErrMetricsInsecure", err)
	}
	if _, err := New(Config{Flavor: core.Discord, Token: "t", Plan: core.Range(1, 0, 0), MetricsListen: ":0"}); !errors.Is(err, ErrMetricsInsecure) {
		t.Errorf("New with MetricsListen :0 = %v; want ErrMetricsInsecure", err)
	}
}

// Debian's prometheus scrapes a node's --metrics-listen and sees it up,
// with its READY shards; the example alert rules pass promtool's check
// and their unit tests. The prometheus binary is a process boundary:
// its API is polled, with a bound.
func TestPrometheusScrapesNode(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prometheus is not installed (apt-get install prometheus)")
		}
		t.Skip("prometheus is not installed (apt-get install prometheus)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("prometheus is installed without promtool")
	}
	rules, _ := filepath.Abs("../examples/prometheus")
	for _, args := range [][]string{
		{"check", "rules", filepath.Join(rules, "shardfs.rules.yml")},
		{"check", "config", filepath.Join(rules, "prometheus.yml")},
		{"test", "rules", filepath.Join(rules, "shardfs.rules.test.yml")},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	sim, err := gatewaysim.New(gatewaysim.Config{Shards: 2, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	n, err := New(Config{Flavor: core.Discord, Token: "sim-token", API: sim.APIURL(), Plan: core.Range(2, 0, 1),
		MaxConcurrency: 2, MetricsListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	n.Start()
	if err := waitReady(n, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	target := n.MetricsAddr().String()
	body := httpGet(t, "http://"+target+"/metrics")
	if !strings.Contains(body, `shardfs_shards{state="READY"} 2`) {
		t.Fatalf("GET /metrics has no shardfs_shards{state=\"READY\"} 2:\n%s", body)
	}

	dir := t.TempDir()
	conf := fmt.Sprintf("global:\n  scrape_interval: 200ms\n  evaluation_interval: 200ms\nrule_files:\n  - %s\nscrape_configs:\n  - job_name: shardfs\n    static_configs:\n      - targets: [%q]\n",
		filepath.Join(rules, "shardfs.rules.yml"), target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	web := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus's output:\n%s", out.String())
		}
	}()

	// Up, and the node's two READY shards, as Prometheus stored them.
	for query, want := range map[string]string{
		`up{job="shardfs"}`:             "1",
		`shardfs_shards{state="READY"}`: "2",
	} {
		bound := 60 * time.Second
		if runtime.GOARCH != "amd64" {
			bound *= 2
		}
		// A process boundary: poll prometheus's API.
		if err := poll.Until(t.Context(), fmt.Sprintf("prometheus's %s = %s", query, want), bound, 100*time.Millisecond, func() error {
			if got := promQuery(web, query); got != want {
				return fmt.Errorf("%q", got)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// promQuery returns the value of the first sample of an instant query,
// or "" while there is none (prometheus still starting, no scrape yet).
func promQuery(addr, query string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&r) != nil || len(r.Data.Result) == 0 {
		return ""
	}
	v, _ := r.Data.Result[0].Value[1].(string)
	return v
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", u, resp.Status, b)
	}
	return string(b)
}

// freePort returns a loopback address no one listens on now, for a
// program that cannot be told to listen on port 0 and say which it got.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
