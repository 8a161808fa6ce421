package fsrv_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/fsrv"
)

// ExampleListenTLS serves a tree on a tls! listener and reads it with a
// client certificate from the same CA; a client without one is refused.
func ExampleListenTLS() {
	ca, _ := certs.NewCA("example CA", certs.Validity{})
	server, _ := ca.Issue(certs.Server, "node0", []string{"127.0.0.1"}, certs.Validity{})
	alice, _ := ca.Issue(certs.Client, "alice", nil, certs.Validity{})

	root := fsrv.NewDir("", &fsrv.Text{Name: "status", Content: func() []byte { return []byte("READY\n") }})
	srv := &fsrv.Server{Root: root}
	l, err := fsrv.ListenTLS("tls!127.0.0.1!0", &tls.Config{Certificates: []tls.Certificate{server.TLS()}, ClientCAs: ca.Pool()})
	if err != nil {
		panic(err)
	}
	go srv.Serve(context.Background(), l)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	addr := "tls!127.0.0.1!" + port

	read := func(conf *tls.Config) (string, error) {
		c, err := fsrv.Dial(context.Background(), addr, conf)
		if err != nil {
			return "", err
		}
		conn, err := client.NewConn(c)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		fsys, err := conn.Attach(nil, "alice", "")
		if err != nil {
			return "", err
		}
		fid, err := fsys.Open("status", plan9.OREAD)
		if err != nil {
			return "", err
		}
		defer fid.Close()
		b, err := io.ReadAll(fid)
		return string(b), err
	}
	pair := alice.TLS()
	s, err := read(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}})
	fmt.Printf("alice: %q %v\n", s, err)
	_, err = read(&tls.Config{RootCAs: ca.Pool()})
	fmt.Println("no certificate:", err != nil)
	// Output:
	// alice: "READY\n" <nil>
	// no certificate: true
}
