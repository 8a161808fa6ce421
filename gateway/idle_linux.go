package gateway

import (
	"syscall"
	"unsafe"
)

const canWaitReadable = true

// readable peeks at the socket without taking anything from it: false (no
// byte yet) makes the runtime wait for readiness and ask again; true lets
// gorilla read whatever came, an error or end of stream included.
func (c *idleConn) readable(fd uintptr) bool {
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&c.peek[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			return e != syscall.EAGAIN
		}
	}
}
