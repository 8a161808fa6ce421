package soak

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections from its own loopback port to a target
// (a node's way to etcd), and can be cut: Cut resets every live connection
// and closes the port, so new connections are refused, as a partition
// between that node and etcd would look to the node's etcd client; Heal
// listens on the same port again.
type Proxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener // nil while cut or closed
	conns map[net.Conn]struct{}
	cut   bool
	wg    sync.WaitGroup
	// Refusing connections from some processes (a partitioned etcd
	// member dialling the others): the processes that may dial, the
	// ones refused, and who dialled each accepted connection.
	dialers func() []int
	refused map[int]bool
	from    map[net.Conn]int // accepted connection → its dialer's pid
	pair    map[net.Conn]net.Conn
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	}()
}

func (p *Proxy) forward(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		reset(c)
		return
	}
	if p.dialers != nil {
		// Who dialled, through /proc: the accepted socket's peer is the
		// dialer's local port.
		pid, _ := socketOwner(portOf(c.RemoteAddr().String()), portOf(p.addr), p.dialers())
		if p.refused[pid] {
			reset(c)
			return
		}
		p.from[c] = pid
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		reset(c)
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	if p.pair != nil {
		p.pair[c] = up
	}
	pipe := func(dst, src net.Conn) {
		defer p.wg.Done()
		_, _ = io.Copy(dst, src)
		// One direction ended: end the other too, as a real peer's close
		// would.
		p.drop(dst)
		p.drop(src)
	}
	p.wg.Add(2)
	go pipe(up, c)
	go pipe(c, up)
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	if p.from != nil {
		delete(p.from, c)
		delete(p.pair, c)
	}
	p.mu.Unlock()
	_ = c.Close()
}

// reset closes c with a TCP reset rather than an orderly close.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Cut resets every connection through the proxy and refuses new ones until
// Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		reset(c)
		delete(p.conns, c)
	}
}

// Heal accepts connections again, on the same port.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.cut = false
	p.serve(ln)
	return nil
}

// Close cuts the proxy for good and waits for its goroutines.
func (p *Proxy) Close() error {
	p.Cut()
	p.wg.Wait()
	return nil
}

// WatchDialers makes the proxy tell its dialers apart among the processes
// dialers returns (through /proc), so that Refuse can cut one of them off.
// Call it before the first connection.
func (p *Proxy) WatchDialers(dialers func() []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialers, p.refused = dialers, map[int]bool{}
	p.from, p.pair = map[net.Conn]int{}, map[net.Conn]net.Conn{}
}

// Refuse resets every connection pid dialled through the proxy and
// refuses its new ones until Admit.
func (p *Proxy) Refuse(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused[pid] = true
	for c, from := range p.from {
		if from == pid {
			reset(c)
			if up := p.pair[c]; up != nil {
				reset(up)
			}
		}
	}
}

// Admit lets pid dial through the proxy again.
func (p *Proxy) Admit(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.refused, pid)
}
