package gateway

import (
	"sync"
	"syscall"
)

const canPark = true

// idler watches the sockets of parked connections with one epoll instance
// and one goroutine, so that a connection with nothing to read has no
// goroutine at all (see conn.serve). Its goroutine starts with the first
// park and ends with the transport.
//
// A parked connection's socket stays open: only its reader closes it, and
// a parked connection has none. The idler takes the socket out of its
// epoll set, under mu, before it hands the connection to a new reader, so
// it never looks at a descriptor that may have been closed and reused.
type idler struct {
	t *Transport

	mu      sync.Mutex
	started bool
	closed  bool
	epfd    int
	stop    [2]int        // a pipe: writing to it ends the goroutine
	parked  map[int]*conn // socket descriptor → parked connection
}

func newIdler(t *Transport) *idler { return &idler{t: t, epfd: -1, stop: [2]int{-1, -1}} }

// startLocked creates the epoll instance and starts the goroutine, once.
func (p *idler) startLocked() bool {
	if p.started {
		return true
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return false
	}
	var stop [2]int
	if err := syscall.Pipe2(stop[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		return false
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(stop[0])}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, stop[0], &ev); err != nil {
		syscall.Close(epfd)
		syscall.Close(stop[0])
		syscall.Close(stop[1])
		return false
	}
	p.epfd, p.stop, p.parked = epfd, stop, map[int]*conn{}
	if !p.t.life.Go(p.loop) {
		syscall.Close(epfd)
		syscall.Close(stop[0])
		syscall.Close(stop[1])
		p.epfd, p.stop, p.parked = -1, [2]int{-1, -1}, nil
		return false
	}
	p.started = true
	return true
}

// park hands c, whose reader is about to end, to the idler. It returns
// false when it cannot (the transport is closing): the reader then waits
// in place. A parked connection holds a count of the transport's wait
// group, which its next reader gives back.
func (p *idler) park(c *conn) bool {
	fd := c.idle.fd
	if fd < 0 {
		return false
	}
	p.mu.Lock()
	if p.closed || !p.startLocked() {
		p.mu.Unlock()
		return false
	}
	p.parked[fd] = c
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: int32(fd)}
	if err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		delete(p.parked, fd)
		p.mu.Unlock()
		return false
	}
	c.t.life.extend() // the reader ending now still holds its own count
	p.mu.Unlock()
	if c.phase().closing() {
		// Close may have looked for a parked reader before there was one.
		p.wake(c)
	}
	return true
}

// unpark takes c out of the idler; false if it was not parked.
func (p *idler) unpark(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unparkLocked(c)
}

func (p *idler) unparkLocked(c *conn) bool {
	fd := c.idle.fd
	if fd < 0 || p.epfd < 0 || p.parked[fd] != c {
		return false
	}
	delete(p.parked, fd)
	_ = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
	return true
}

// wake gives a parked connection a reader again: Close needs one to send
// the close frame.
func (p *idler) wake(c *conn) {
	if p.unpark(c) {
		go c.resume()
	}
}

// close ends the goroutine. Transport.Close calls it after closing every
// connection, so that none is parked any more; none can park afterwards.
func (p *idler) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.started && p.stop[1] >= 0 {
		_, _ = syscall.Write(p.stop[1], []byte{0})
	}
}

func (p *idler) loop() {
	defer func() {
		p.mu.Lock()
		p.closed = true
		syscall.Close(p.epfd)
		syscall.Close(p.stop[0])
		syscall.Close(p.stop[1])
		// The numbers may belong to other files from now on.
		p.epfd, p.stop = -1, [2]int{-1, -1}
		p.mu.Unlock()
	}()
	p.mu.Lock()
	epfd, stopfd := p.epfd, p.stop[0]
	p.mu.Unlock()
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			p.t.log.Error("gateway: idle connections cannot be watched", "err", err)
			p.abandon()
			return
		}
		var woken []*conn
		stop := false
		p.mu.Lock()
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == stopfd {
				stop = true
				continue
			}
			if c := p.parked[fd]; c != nil && p.unparkLocked(c) {
				woken = append(woken, c)
			}
		}
		p.mu.Unlock()
		for _, c := range woken {
			go c.resume()
		}
		if stop {
			return
		}
	}
}

// abandon gives every parked connection its reader back, after the epoll
// instance failed, and lets none park again.
func (p *idler) abandon() {
	p.mu.Lock()
	p.closed = true
	var woken []*conn
	for _, c := range p.parked {
		if p.unparkLocked(c) {
			woken = append(woken, c)
		}
	}
	p.mu.Unlock()
	for _, c := range woken {
		go c.resume()
	}
}

// parkedCount is how many connections are parked.
func (p *idler) parkedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.parked)
}
