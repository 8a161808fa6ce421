//go:build !linux

package gateway

// Elsewhere idle readers park in gorilla's read path, at 8 KiB of stack.
const canWaitReadable = false

func (c *idleConn) readable(uintptr) bool { return true }
