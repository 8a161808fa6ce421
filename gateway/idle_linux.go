package gateway

import (
	"net"
	"os"
	"syscall"
	"unsafe"
)

const canWaitReadable = true

// readable takes what the socket has, without waiting, into the
// read-ahead buffer: false (nothing yet) makes the runtime wait for
// readiness and ask again; true lets gorilla read what came. End of stream
// and errors are left for the next read of the connection to report, an
// error the system call consumed (a reset) kept for it.
func (c *idleConn) readable(fd uintptr) bool {
	a := c.sock
	b := a.pool.Get().(*[]byte)
	for {
		n, _, e := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&(*b)[0])), uintptr(len(*b)),
			syscall.MSG_DONTWAIT, 0, 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			a.pool.Put(b)
			return false
		case 0:
			if n == 0 {
				a.pool.Put(b) // end of stream: the next read says so
				return true
			}
			a.set(b, int(n), nil)
			return true
		default:
			a.set(b, 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("recvfrom", e)})
			return true
		}
	}
}
