package client

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Relay forwards 9P between the kernel's end of a trans=fd mount and a
// connection to the tree, in both directions, until either side ends.
// It is what lets v9fs reach a tree over TLS, or any connection the
// kernel cannot dial itself (diodmount does the same for diod).
type Relay struct {
	kernel, server net.Conn
	wg             sync.WaitGroup
	once           sync.Once
	done           chan struct{}
	kernelEnded    bool  // written once, before done is closed
	firstErr       error // the server side's error when it ended first

	mu         sync.Mutex
	serverErrs []error // each direction's server-side failure, in the order they ended
}

// NewRelay starts relaying between kernel, the local end of the socket
// pair whose other end the kernel mounts, and server. The Relay owns
// both connections.
func NewRelay(kernel, server net.Conn) *Relay {
	r := &Relay{kernel: kernel, server: server, done: make(chan struct{})}
	r.wg.Add(2)
	// Which side ended is told by where the copy failed, reading or
	// writing: after an unmount, a reply still on its way from the
	// server meets the kernel's closed end.
	go func() {
		defer r.wg.Done()
		if _, werr := pump(server, kernel); werr != nil {
			r.end(false, werr)
			return
		}
		r.end(true, nil)
	}()
	go func() {
		defer r.wg.Done()
		rerr, werr := pump(kernel, server)
		if werr != nil {
			r.end(true, nil)
			return
		}
		r.end(false, rerr) // io.EOF: the server closed the connection
	}()
	return r
}

// end records how one direction ended. The first to end closes both
// connections, so that a kernel waiting in mount(2) for a server that
// refused us sees EOF and fails.
func (r *Relay) end(kernel bool, serverErr error) {
	if serverErr != nil {
		r.mu.Lock()
		r.serverErrs = append(r.serverErrs, serverErr)
		r.mu.Unlock()
	}
	r.once.Do(func() {
		r.kernelEnded, r.firstErr = kernel, serverErr
		close(r.done) // before the close makes the other direction end
		r.shut()
	})
}

// shut closes both connections without waiting for the directions.
func (r *Relay) shut() {
	r.kernel.Close()
	r.server.Close()
}

// Done is closed when the first direction ends.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Err says why the relay ended, once Done is closed: nil when the kernel
// closed its end (the file system was unmounted), else the server
// side's failure, io.EOF when the server closed the connection.
func (r *Relay) Err() error {
	<-r.done
	if r.kernelEnded {
		return nil
	}
	return r.firstErr
}

// Close ends both directions now and waits for them.
func (r *Relay) Close() error {
	r.shut()
	r.wg.Wait()
	return nil
}

// refusal is the server's error that explains a mount(2) that failed:
// what the server said before it closed, not our own close.
func (r *Relay) refusal() error {
	r.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, err := range r.serverErrs {
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}

// pump copies src to dst until one fails, and says which.
func pump(dst, src net.Conn) (readErr, writeErr error) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return nil, werr
			}
		}
		if err != nil {
			return err, nil
		}
	}
}
