package baremetal

import (
	"context"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// reap waits for every exited child without blocking and reports each.
// PID 1 inherits every orphan of the system; a zombie that no one waits
// for holds its PID forever.
func reap(report func(pid int, status unix.WaitStatus)) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		report(pid, ws)
	}
}

// reapLoop reaps at every SIGCHLD until ctx ends. Nothing else in PID 1
// may wait for a child (os/exec's Wait would lose the race): the node
// starts none.
func reapLoop(ctx context.Context, report func(pid int, status unix.WaitStatus)) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	defer signal.Stop(sig)
	reap(report) // children that exited before Notify
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			reap(report)
		}
	}
}
