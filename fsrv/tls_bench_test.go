package fsrv

import (
	"context"
	"net"
	"testing"

	"github.com/hugelgupf/p9/p9"
)

// The cost of TLS, each against plain TCP on loopback in the same run:
// BenchmarkConnect is what a client or a mount pays to connect (dial,
// TLS 1.3 handshake with client certificates, ECDSA P-256, Tversion,
// Tattach, one Tgetattr, close); BenchmarkRoundTrip is one request on an
// established connection (Tgetattr) and one `cat status` (walk, open,
// read, clunk).

// benchTransports serves a fixture on plain TCP and on TLS and returns a
// dial function for each.
func benchTransports(b *testing.B) map[string]func() (net.Conn, error) {
	p := newPKI(b)
	fx := newFixture()
	srv := &Server{Root: fx.root, Clock: fx.clock}
	tcpAddr := listen(b, srv)
	l, err := ListenTLS("tls!127.0.0.1!0", p.serverConf(p.server))
	if err != nil {
		b.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(serveOn(b, srv, l))
	tlsAddr := "tls!127.0.0.1!" + port
	conf := p.clientConf(p.client)
	return map[string]func() (net.Conn, error){
		"tcp": func() (net.Conn, error) { return net.Dial("tcp", tcpAddr) },
		"tls": func() (net.Conn, error) { return Dial(context.Background(), tlsAddr, conf) },
	}
}

func BenchmarkConnect(b *testing.B) {
	dials := benchTransports(b)
	for _, name := range []string{"tcp", "tls"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				c, err := dials[name]()
				if err != nil {
					b.Fatal(err)
				}
				cl, err := p9.NewClient(c)
				if err != nil {
					b.Fatal(err)
				}
				root, err := cl.Attach("")
				if err != nil {
					b.Fatal(err)
				}
				if _, _, _, err := root.GetAttr(p9.AttrMaskAll); err != nil {
					b.Fatal(err)
				}
				cl.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/connect")
		})
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	dials := benchTransports(b)
	for _, name := range []string{"tcp", "tls"} {
		c, err := dials[name]()
		if err != nil {
			b.Fatal(err)
		}
		cl, err := p9.NewClient(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cl.Close() })
		root, err := cl.Attach("")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("getattr/"+name, func(b *testing.B) {
			for b.Loop() {
				if _, _, _, err := root.GetAttr(p9.AttrMaskAll); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
		})
		b.Run("cat/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := catDotL(root); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
