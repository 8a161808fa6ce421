package gateway

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// childSimEnv makes the test binary serve a simulator instead of running
// tests; the benchmarks start it so that their CPU and memory figures hold
// the client's work alone.
const childSimEnv = "SHARDFS_GATEWAY_CHILD_SIM"

// runChildSim serves a simulator on real time. It prints "ready API" and
// then obeys lines on stdin: "flood SHARD N" (answered "ok"); EOF ends it.
// With childSimEnv_TLS=1 the gateway speaks wss:// on a certificate of its
// own: the line is then "ready API wss://ADDR/ CERT", CERT the certificate
// in base64 DER.
func runChildSim() int {
	shards, _ := strconv.Atoi(os.Getenv(childSimEnv + "_SHARDS"))
	cfg := gatewaysim.Config{
		Shards:            max(shards, 1),
		MaxConcurrency:    max(shards, 1),
		SessionStartLimit: 1 << 20,
		HeartbeatInterval: time.Hour,
	}
	if os.Getenv(childSimEnv) == "fluxer" {
		cfg.Flavor = gatewaysim.Fluxer
	}
	var tlsInfo string
	if os.Getenv(childSimEnv+"_TLS") == "1" {
		cert, _, err := gatewaysim.SelfSigned()
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		cfg.Listener = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		tlsInfo = " wss://" + ln.Addr().String() + "/ " + base64.StdEncoding.EncodeToString(cert.Certificate[0])
	}
	srv, err := gatewaysim.New(cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer srv.Close()
	fmt.Println("ready " + srv.APIURL() + tlsInfo)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "flood" {
			id, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			fmt.Println("ok", srv.Flood(id, n))
		}
	}
	return 0
}

// childSim is a simulator running in a child process.
type childSim struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	api   string
	// wss and roots, for a simulator started with TLS: its gateway URL and
	// a pool that trusts its certificate.
	wss   string
	roots *x509.CertPool
}

func startChildSim(tb testing.TB, flavor core.Flavor, shards int) *childSim {
	return startChildSimTLS(tb, flavor, shards, false)
}

func startChildSimTLS(tb testing.TB, flavor core.Flavor, shards int, wss bool) *childSim {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childSimEnv+"="+flavor.String(), childSimEnv+"_SHARDS="+strconv.Itoa(shards))
	if wss {
		cmd.Env = append(cmd.Env, childSimEnv+"_TLS=1")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &childSim{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	line := c.line(tb)
	api, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		c.close()
		tb.Fatalf("child simulator: %q", line)
	}
	c.api = api
	if wss {
		f := strings.Fields(api)
		if len(f) != 3 {
			c.close()
			tb.Fatalf("child simulator with TLS: %q", line)
		}
		der, err := base64.StdEncoding.DecodeString(f[2])
		cert, err2 := x509.ParseCertificate(der)
		if err != nil || err2 != nil {
			c.close()
			tb.Fatalf("child simulator's certificate: %v %v", err, err2)
		}
		c.api, c.wss, c.roots = f[0], f[1], x509.NewCertPool()
		c.roots.AddCert(cert)
	}
	return c
}

func (c *childSim) line(tb testing.TB) string {
	tb.Helper()
	if !c.out.Scan() {
		tb.Fatalf("child simulator ended: %v", c.out.Err())
	}
	return c.out.Text()
}

func (c *childSim) flood(tb testing.TB, shard, n int) {
	tb.Helper()
	fmt.Fprintf(c.stdin, "flood %d %d\n", shard, n)
	if got := c.line(tb); got != "ok 1" {
		tb.Fatalf("flood: %q; want one session flooded", got)
	}
}

func (c *childSim) close() {
	c.stdin.Close()
	_ = c.cmd.Wait()
}
