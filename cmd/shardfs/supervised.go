package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/supervisor"
)

// childLink is serve's side of a supervisor's private channel, when
// supervise started it (nil otherwise): the node asks the parent for its
// identify slots, tells it when it serves and how many shards are READY,
// and shuts down when the parent asks or goes away.
type childLink struct {
	*supervisor.Link
	log    *slog.Logger // serve's
	wg     sync.WaitGroup
	cancel context.CancelFunc
	// copying ends the copies of the logs, only in Close: after the node
	// closed, so that the parent gets every line written before the
	// sessions were saved.
	copying    context.Context
	endCopying context.CancelFunc
}

// supervisedChild opens the link; ctx ends when the parent asks for the
// shutdown. Close (on a nil link too) releases it.
func supervisedChild(ctx context.Context) (context.Context, *childLink, error) {
	l, err := supervisor.LinkFromEnv()
	if l == nil || err != nil {
		return ctx, nil, err
	}
	ctx, c := linkChild(ctx, l)
	return ctx, c, nil
}

// linkChild is supervisedChild once the link is open.
func linkChild(ctx context.Context, l *supervisor.Link) (context.Context, *childLink) {
	// Its stderr is a pipe to the parent: a parent that died (an OOM
	// kill, a panic, a dead "| tee") must not kill the child on its next
	// log line before it saved its sessions. Writes to the pipe fail
	// instead, and the end of the channel starts the clean shutdown
	// (every shard closed 4000 and saved), as SIGTERM does.
	signal.Ignore(syscall.SIGPIPE)
	c := &childLink{Link: l}
	c.copying, c.endCopying = context.WithCancel(context.Background())
	ctx, c.cancel = context.WithCancel(ctx)
	// The child is its own process group: when the parent dies while a
	// child is stopped (SIGSTOP, a debugger), the kernel sends the
	// orphaned group SIGHUP and SIGCONT, and Go's default for SIGHUP is
	// to exit without saving. A hangup means the parent is gone, as the
	// end of the channel does: the same clean shutdown. The handler stays
	// for the life of the process, so that a later hangup cannot cut the
	// shutdown short either.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	c.wg.Go(func() {
		select {
		case <-l.Done():
			c.cancel()
		case <-hup:
			c.cancel()
		case <-ctx.Done():
		}
	})
	return ctx, c
}

// Configure makes the node ask the parent for identify slots, write each
// identify no sooner than its grant's floor and report each write (the
// parent spaces a bucket's identifies across children from the writes),
// and keep its dispatch lines only in transit to the parent, whose logs
// alone hold their history (DESIGN 7.4).
func (c *childLink) Configure(cfg *node.Config) {
	cfg.DispatchRetention, cfg.NodeDispatchRetention = supervisor.TransitShardDispatch, supervisor.TransitDispatch
	cfg.EventRetention, cfg.NodeEventRetention = supervisor.TransitShardEvents, supervisor.TransitEvents
	cfg.IdentifyPacer = c.Pacer()
	cfg.OnSession = c.Session
	cfg.IdentifyNotBefore, cfg.IdentifyWritten = c.IdentifyNotBefore, c.IdentifyWritten
}

// Starting makes the node refuse moves (see childMoveRefusal) and links
// its pacer to the parent's before it starts: what the child's discovery
// learnt reaches the shared pacer before the child's first identify
// request, and later discoveries follow.
func (c *childLink) Starting(n *node.Node) {
	c.refuseMoves(n)
	if n.Pacer != nil {
		c.LimitsFrom(n.Pacer)
	}
}

// childMoveRefusal is why a supervised child refuses to move to a larger
// plan, by hand or on a 4011, even when it runs the whole plan
// (supervise --processes 1): its parent decides the plan and refuses the
// move on its own /ctl too.
const childMoveRefusal = "supervise does not move to a larger plan yet (each child runs a block of the plan the parent chose; doc/reshard.md says what it needs): stop supervise and start it again with the new --total"

// refuseMoves makes a supervised node refuse every move (see
// childMoveRefusal).
func (c *childLink) refuseMoves(n *node.Node) {
	if c != nil {
		n.RefuseMoves(childMoveRefusal)
	}
}

// Serving tells the parent the node serves, at socket, and reports its
// shards until ctx ends.
func (c *childLink) Serving(ctx context.Context, n *node.Node, socket string) {
	if err := c.Ready(socket); err != nil {
		c.log.Error("telling the supervisor this child is ready", "err", err)
	}
	c.wg.Go(func() { c.Watch(ctx, n.Scheduler) })
	c.wg.Go(func() { c.CopyDispatch(c.copying, n.Tree.NodeDispatchLog()) })
	c.wg.Go(func() { c.CopyNamed(c.copying, "events", n.Scheduler.Events()) })
}

func (c *childLink) Close() {
	if c == nil {
		return
	}
	c.cancel()
	c.endCopying()
	c.wg.Wait()
	c.Link.Close()
}
