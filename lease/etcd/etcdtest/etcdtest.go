// Package etcdtest starts a real, single-member etcd server in-process for
// tests: loopback ports chosen at random, a temporary data folder, and a
// bounded wait for it to be ready.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// ReadyTimeout bounds the wait for a started server to accept requests. A
// cold start under the race detector on a loaded 2-core machine takes about
// a second; the bound is generous because this is a real server.
const ReadyTimeout = 30 * time.Second

// Server is a running embedded etcd.
type Server struct {
	// Endpoint is the client URL (http://127.0.0.1:PORT).
	Endpoint string

	t    testing.TB
	etcd *embed.Etcd
	dir  string
}

// Start starts a server whose data lives in a folder of t.TempDir and which
// stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	var lastErr error
	// The ports are found free and then handed to etcd, so another process
	// may take one in between: try a few times.
	for attempt := 0; attempt < 3; attempt++ {
		s, err := start(t, dir, attempt)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		lastErr = err
	}
	t.Fatalf("etcdtest: start: %v", lastErr)
	return nil
}

func start(t testing.TB, dir string, attempt int) (*Server, error) {
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := Config("etcdtest", fmt.Sprintf("%s/data%d", dir, attempt), fmt.Sprintf("127.0.0.1:%d", cport), fmt.Sprintf("127.0.0.1:%d", pport))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed before ready: %w", err)
	case <-time.After(ReadyTimeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("etcd not ready within %v", ReadyTimeout)
	}
	return &Server{Endpoint: cfg.ListenClientUrls[0].String(), t: t, etcd: e, dir: cfg.Dir}, nil
}

// Stop stops the server; later requests fail. It is safe to call twice.
func (s *Server) Stop() {
	if s.etcd == nil {
		return
	}
	s.etcd.Close()
	s.etcd = nil
}

// Client returns a client of s, closed when the test ends. opts are added to
// its gRPC dial options (e.g. an interceptor that counts requests).
func (s *Server) Client(opts ...grpc.DialOption) *clientv3.Client {
	s.t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint},
		DialTimeout: 5 * time.Second,
		DialOptions: opts,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		s.t.Fatalf("etcdtest: client: %v", err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Ctx returns a context bounded by d of real time, cancelled when the test
// ends: every request to the real server is bounded.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Config is the configuration of a one-member etcd called name, keeping
// its data in dir and serving clients on clientHost and its peer port on
// peerHost (host:port, plain HTTP), logging nothing: its errors reach a
// test through the client.
func Config(name, dir, clientHost, peerHost string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = name, dir
	curl := url.URL{Scheme: "http", Host: clientHost}
	purl := url.URL{Scheme: "http", Host: peerHost}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return cfg
}
