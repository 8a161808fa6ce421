package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/shardfs/shardfs/baremetal"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/lease/local"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/shardfs"
)

// runPID1 is the binary as /init of a netboot image (package baremetal):
// it never returns, since PID 1 exiting panics the kernel.
func runPID1(ctx context.Context, input io.Reader, console io.Writer) {
	// The serial console answers the terminal ioctls, but a status line
	// redrawn in place is noise in a console log: plain lines only.
	console = plainWriter{console}
	// u-root's DHCP client logs each lease's whole packet dump through
	// the standard logger: its first line is enough.
	log.SetOutput(firstLine{console})
	for {
		err := baremetal.Boot(ctx, baremetal.Config{
			Console: console,
			Input:   input,
			Run: func(ctx context.Context, s baremetal.Settings, token string) error {
				if token == "" {
					return serveNoToken(ctx, s, console)
				}
				return serveFiles(ctx, s.Args(), console, console, func(string) (string, error) { return token, nil }, enrollFiles(s))
			},
		})
		fmt.Fprintf(console, "shardfs-init: boot ended: %v; starting over in 1s\n", err)
		time.Sleep(time.Second) // never a tight loop in PID 1
	}
}

// enrollFiles are a PXE node's /enroll: status, the enrollment server,
// the node's key fingerprint and when it enrolled (none when it did not).
func enrollFiles(s baremetal.Settings) []fsrv.File {
	if s.Enrollment == nil {
		return nil
	}
	text := s.Enrollment.Text()
	return []fsrv.File{fsrv.NewDir("enroll", &fsrv.Text{Name: "status", Content: func() []byte { return text }})}
}

// plainWriter hides the console's *os.File from the terminal checks.
type plainWriter struct{ w io.Writer }

func (p plainWriter) Write(b []byte) (int, error) { return p.w.Write(b) }

// firstLine writes the first line of each write (the standard logger
// writes each message in one call).
type firstLine struct{ w io.Writer }

func (f firstLine) Write(b []byte) (int, error) {
	line, _, cut := bytes.Cut(b, []byte("\n"))
	if !cut {
		return f.w.Write(b)
	}
	if _, err := f.w.Write(append(line[:len(line):len(line)], '\n')); err != nil {
		return 0, err
	}
	return len(b), nil
}

// errNoToken is every shard's failure on a node that did not enroll.
var errNoToken = errors.New("no token: the node did not enroll for one (no shardfs.enroll on its kernel command line, or the enrollment server has no --token-file); nothing can connect until it reboots and enrolls")

// noToken is the transport of a node without a token: every attempt
// fails at once, fatally.
type noToken struct{ wg sync.WaitGroup }

func (t *noToken) Connect(l *core.Link, _ core.Attempt) core.Conn {
	// Connect must return before the Link hears of the outcome.
	t.wg.Go(func() { l.Fail(core.Failure{Class: core.FatalFailure, Err: errNoToken}) })
	return noConn{}
}

// Request lets every shard try at once: no identify is ever sent, so
// there is nothing to pace, and every shard shows FATAL without waiting
// for a slot.
func (t *noToken) Request(int, bool, func()) (bool, func()) { return true, func() {} }

// BudgetWait: no budget holds anything back.
func (t *noToken) BudgetWait(bool) time.Time { return time.Time{} }

type noConn struct{}

func (noConn) Close(int)         {}
func (noConn) Send([]byte) error { return errNoToken }
func (noConn) Identify()         {}

// newNoTokenNode assembles the core and tree of a node without a token;
// nothing has started.
func newNoTokenNode(s baremetal.Settings, log *slog.Logger) (*core.Scheduler, *noToken, *shardfs.Tree, error) {
	total, _ := strconv.Atoi(s.Total)
	if total == 0 {
		total = 1
	}
	var ids []int
	if s.Shards != "" {
		var err error
		if ids, err = core.ParseShardList(s.Shards); err != nil {
			return nil, nil, nil, fmt.Errorf("--shards: %w", err)
		}
	}
	plan, err := node.Plan(total, ids)
	if err != nil {
		return nil, nil, nil, err
	}
	tr := &noToken{}
	n, err := core.New(core.Config{Plan: plan, Flavor: s.Flavor, Transport: tr, Pacer: tr, Lease: local.New(nil), Logger: log.With("component", "core")})
	if err != nil {
		return nil, nil, nil, err
	}
	tree := shardfs.New(shardfs.Config{Scheduler: n, Logger: log, Info: func() [][2]string { return [][2]string{{"token", "none"}} }, Files: enrollFiles(s)})
	return n, tr, tree, nil
}

// serveNoToken serves the tree of s's plan with every shard FATAL with
// "no token", so that an operator sees over the network why the node does
// nothing. With shardfs.total=auto (discovery needs the token) the plan is
// shard 0 of 1.
func serveNoToken(ctx context.Context, s baremetal.Settings, console io.Writer) error {
	ls, err := fsrv.Open(s.Listen, fsrv.TLSFiles{Cert: s.TLSCert, Key: s.TLSKey, ClientCA: s.TLSClientCA})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(console, nil))
	n, tr, tree, err := newNoTokenNode(s, log)
	if err != nil {
		ls.Close()
		return err
	}
	srv := &fsrv.Server{Root: tree.Root(), Logger: log.With("component", "9p")}
	for _, l := range ls.List {
		log.Info("serving the tree over 9P without a token: every shard is FATAL", "addr", fsrv.AddrString(l), "access", fsrv.Access(l))
	}
	n.Start()
	var wg sync.WaitGroup
	errs := make([]error, len(ls.List))
	for i, l := range ls.List {
		wg.Go(func() {
			if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, fsrv.ErrServerClosed) {
				errs[i] = err
			}
		})
	}
	<-ctx.Done()
	n.Close()
	tr.wg.Wait()
	err = srv.Close()
	wg.Wait()
	return errors.Join(append(errs, err)...)
}
