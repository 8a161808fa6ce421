package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ErrMetricsInsecure refuses a metrics address beyond loopback that does
// not say ",insecure".
var ErrMetricsInsecure = errors.New("metrics over plain HTTP beyond loopback")

// listenMetrics opens Config.MetricsListen: HOST:PORT, loopback only
// unless ",insecure" follows. The tree's /metrics holds no secret and
// takes no command, but it is plain HTTP and shows every shard's state
// and traffic to whoever reaches it, so a scrape from another machine is
// a choice written down, as for the 9P listeners; every interface
// (":9464", "0.0.0.0:9464") is beyond loopback. A host name must resolve
// to loopback addresses only.
func listenMetrics(addr string) (net.Listener, error) {
	if err := CheckMetricsListen(addr); err != nil {
		return nil, err
	}
	base, _, _ := strings.Cut(addr, ",")
	l, err := net.Listen("tcp", base)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	return l, nil
}

// CheckMetricsListen refuses a metrics address New would refuse, without
// listening: a command checks its flags with it before it spends time on
// discovery.
func CheckMetricsListen(addr string) error {
	base, opt, _ := strings.Cut(addr, ",")
	if opt != "" && opt != "insecure" {
		return fmt.Errorf("--metrics-listen %q: unknown option %q (known: insecure)", addr, opt)
	}
	host, port, err := net.SplitHostPort(base)
	if err != nil {
		return fmt.Errorf("--metrics-listen %q: want HOST:PORT, e.g. 127.0.0.1:9464: %v", addr, err)
	}
	if opt != "insecure" && !loopback(host) {
		h := host
		if h == "" {
			h = "every interface"
		}
		return fmt.Errorf("--metrics-listen %q: %w (%s): listen on 127.0.0.1:%s and let the scraper reach it through a tunnel or proxy, or add ,insecure to serve it anyway", addr, ErrMetricsInsecure, h, port)
	}
	return nil
}

// loopback reports whether every address host stands for is loopback.
func loopback(host string) bool {
	if host == "" {
		return false
	}
	ips := []net.IP{net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))}
	if ips[0] == nil {
		addrs, err := net.DefaultResolver.LookupIPAddr(context.Background(), host)
		if err != nil || len(addrs) == 0 {
			return false
		}
		ips = ips[:0]
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// metricsServer serves /metrics over HTTP for Prometheus: the registry of
// the plan the tree shows, read at each scrape, so that after a move to a
// larger plan it shows the new plan's shards as /metrics does.
type metricsServer struct {
	l    net.Listener
	srv  *http.Server
	done chan struct{}
}

func newMetricsServer(l net.Listener, registry func() *prometheus.Registry) *metricsServer {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		reg := registry()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "shardfs: the metrics are at /metrics")
	})
	return &metricsServer{l: l, done: make(chan struct{}), srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}}
}

func (m *metricsServer) start() {
	go func() {
		defer close(m.done)
		m.srv.Serve(m.l) // ErrServerClosed at close; another error ends the scrapes alone
	}()
}

// close stops the server; with started it waits for its goroutine.
func (m *metricsServer) close(started bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.srv.Shutdown(ctx)
	m.l.Close() // not served yet when the node never started
	if started {
		<-m.done
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// MetricsAddr returns the address /metrics is served on over HTTP
// (Config.MetricsListen), or nil.
func (s *Node) MetricsAddr() net.Addr {
	if s.metrics == nil {
		return nil
	}
	return s.metrics.l.Addr()
}
