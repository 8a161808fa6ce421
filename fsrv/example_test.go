package fsrv_test

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync/atomic"
	"time"

	"9fans.net/go/plan9"
	"9fans.net/go/plan9/client"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/journal"
)

// Example builds a tiny tree (a status file, a ctl file, an event log and a
// directory), serves it, and uses it as plan9port's tools would.
func Example() {
	var state atomic.Value // callbacks run on the server's goroutines
	state.Store("READY")
	current := func() []byte { return []byte(state.Load().(string) + "\n") }
	events := journal.New(1 << 20)
	events.Append([]byte("ts=2026-11-30T07:00:00Z event=ready\n"), time.Now())

	root := fsrv.NewDir("",
		&fsrv.Text{Name: "status", Content: current},
		&fsrv.Ctl{
			Name: "ctl",
			Handle: func(line string) error {
				switch line {
				case "stop":
					state.Store("STOPPED")
					return nil
				}
				return fmt.Errorf("%w: unknown command %q", fs.ErrInvalid, line)
			},
			Usage: func() string { return "stop\n" },
		},
		&fsrv.LogFile{Name: "events", Source: events},
		fsrv.NewDir("0", &fsrv.Text{Name: "state", Content: current}),
	)
	srv := &fsrv.Server{Root: root}
	l, err := fsrv.Listen("tcp!127.0.0.1!0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(context.Background(), l)
	defer srv.Close()

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		panic(err)
	}
	conn, err := client.NewConn(c)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	fsys, err := conn.Attach(nil, "glenda", "")
	if err != nil {
		panic(err)
	}
	cat := func(name string) {
		fid, err := fsys.Open(name, plan9.OREAD)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer fid.Close()
		b, _ := io.ReadAll(fid)
		fmt.Printf("%s: %s", name, b)
	}
	echo := func(name, text string) {
		fid, err := fsys.Open(name, plan9.OWRITE|plan9.OTRUNC)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer fid.Close()
		if _, err := fid.Write([]byte(text)); err != nil {
			fmt.Println(err)
		}
	}

	cat("0/state")
	cat("events")
	echo("ctl", "frob\n")
	echo("ctl", "stop\n")
	cat("status")
	echo("status", "READY\n")
	d, _ := fsys.Stat("0")
	fmt.Println(d.Name, d.Mode)
	// Output:
	// 0/state: READY
	// events: ts=2026-11-30T07:00:00Z event=ready
	// invalid argument: unknown command "frob"
	// status: STOPPED
	// permission denied: status is read-only
	// 0 d-r-xr-xr-x
}
