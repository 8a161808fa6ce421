package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardfs/shardfs/core"
)

// TokenFDVar is the variable through which serve finds the descriptor of
// the pipe that holds its token (the same one serve's re-execution uses).
const TokenFDVar = "SHARDFS_TOKEN_FD"

// Exec starts children as processes of a binary (the parent's own, running
// serve). Each gets its token in a pipe (descriptor 3) and its private
// channel (a socketpair, descriptor 4), never in its arguments or
// environment; it runs in its own process group, so that a terminal's
// Ctrl-C reaches the parent alone, which stops the children in order.
type Exec struct {
	// Path is the binary; Args returns its arguments for a start.
	Path string
	Args func(l Launch) []string
	// Env is the children's environment (the token is never in it).
	Env   []string
	Token string
	// Pacer grants every child's identify slots.
	Pacer core.IdentifyPacer
	// Output receives the children's output, labelled.
	Output *Output
	// Lines receives the dispatch and event lines the children copy
	// (Tree.Line); nil drops them.
	Lines func(child, kind string, line []byte)
	// Sessions receives each new session a child reports (Tree.Session).
	Sessions func(child string, shard int, s core.Session, seq int64)
	// Limits receives the session start limit a child's discovery
	// learnt (the shared pacer's SetStartLimit, which lowers what
	// remains, never raises it); nil drops it.
	Limits func(child string, l core.StartLimit)

	wg sync.WaitGroup
}

// Wait waits for the goroutines of every child launched, which end once
// their process has exited.
func (e *Exec) Wait() { e.wg.Wait() }

type execProc struct {
	id     string
	cmd    *exec.Cmd
	conn   net.Conn
	w      *msgWriter
	reaped chan struct{} // closed once waitpid returned
	read   chan struct{} // closed when the channel's reader ended

	mu      sync.Mutex
	cancels map[uint64]func()
	gone    bool
}

func (p *execProc) Pid() int { return p.cmd.Process.Pid }

// Signal also asks for the shutdown on the channel, for a child that
// cannot see the signal; SIGTERM is what a child that does not read the
// channel still obeys.
func (p *execProc) Signal(sig os.Signal) error {
	if sig == syscall.SIGTERM {
		p.conn.SetWriteDeadline(time.Now().Add(time.Second))
		p.w.send(msg{T: "shutdown"})
	}
	return p.cmd.Process.Signal(sig)
}

// Launch starts one child.
func (e *Exec) Launch(l Launch, r *Reports) (Process, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("child %q: socketpair: %w", l.ID, err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(pair[0]), "channel"), os.NewFile(uintptr(pair[1]), "channel")
	defer childEnd.Close()
	conn, err := net.FileConn(parentEnd)
	parentEnd.Close()
	if err != nil {
		return nil, fmt.Errorf("child %q: channel: %w", l.ID, err)
	}
	tokR, tokW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("child %q: token pipe: %w", l.ID, err)
	}
	defer tokR.Close()
	_, err = tokW.WriteString(e.Token) // a pipe holds 64 KiB; a token at most 4 KiB
	tokW.Close()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("child %q: token pipe: %w", l.ID, err)
	}
	cmd := exec.Command(e.Path, e.Args(l)...)
	cmd.Env = append(append([]string(nil), e.Env...), TokenFDVar+"=3", ChannelFDVar+"=4")
	cmd.ExtraFiles = []*os.File{tokR, childEnd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		conn.Close()
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("child %q: %w", l.ID, err)
	}
	p := &execProc{id: l.ID, cmd: cmd, conn: conn, w: &msgWriter{w: conn}, reaped: make(chan struct{}), read: make(chan struct{}), cancels: map[uint64]func(){}}
	var outs sync.WaitGroup
	outs.Go(func() { e.Output.copy(l.ID, stdout) })
	outs.Go(func() { e.Output.copy(l.ID, stderr) })
	e.wg.Go(func() {
		defer close(p.read)
		e.channel(p, r)
	})
	e.wg.Go(func() {
		outs.Wait() // Wait closes the pipes: read them to the end first
		err := cmd.Wait()
		p.mu.Lock()
		p.gone = true
		cancels := p.cancels
		p.cancels = nil
		p.mu.Unlock()
		for _, cancel := range cancels {
			cancel() // a slot granted to a dead child would be spent for nothing
		}
		close(p.reaped)
		// The child's last lines (a clean stop flushes its dispatch
		// lines after saving its sessions) may still be in the socket:
		// the channel is read to its end, which the child's exit
		// brings, before the exit is reported. Only a process that
		// inherited the child's end (none of ours does) could hold it
		// open: after channelDrain it is cut.
		select {
		case <-p.read:
		case <-time.After(channelDrain):
			r.Broken(fmt.Errorf("child %q exited, but its private channel did not end within %v", p.id, channelDrain))
			conn.Close()
			<-p.read
		}
		conn.Close()
		r.Exited(err)
	})
	return p, nil
}

// channelDrain bounds the reading of a channel after its child's exit.
const channelDrain = 5 * time.Second

// channel reads the child's messages until the channel ends.
func (e *Exec) channel(p *execProc, r *Reports) {
	mr := newMsgReader(p.conn)
	for {
		m, err := mr.next()
		if err != nil {
			if errors.Is(err, ErrGarbage) && !errors.Is(err, errCutShort) {
				r.Broken(fmt.Errorf("child %q: %w", p.id, err))
				io.Copy(io.Discard, p.conn) // the child must not block on it
				return
			}
			// The end of the channel comes with the child's exit
			// (killed, it may cut its last line); alone, it is a
			// child that closed it.
			select {
			case <-p.reaped:
			case <-time.After(2 * time.Second):
				r.Broken(fmt.Errorf("child %q closed its private channel", p.id))
			}
			return
		}
		switch m.T {
		case "ready":
			r.Ready(m.Socket)
		case "status":
			if m.Total > 0 && m.Ready == m.Total {
				r.Settled()
			}
		case "dispatch", "event":
			if e.Lines != nil {
				e.Lines(p.id, m.T, m.Raw)
			}
		case "session":
			if e.Sessions != nil {
				e.Sessions(p.id, m.Shard, core.Session{ID: m.SID, ResumeURL: m.URL}, m.Seq)
			}
		case "limit":
			if e.Limits != nil {
				e.Limits(p.id, core.StartLimit{Total: m.Total, Remaining: m.Remaining, ResetAfter: time.Duration(m.ResetAfterMs) * time.Millisecond, MaxConcurrency: m.MaxConc})
			}
		case "written":
			if fp, ok := e.Pacer.(FloorPacer); ok {
				fp.Written(m.Shard, time.Unix(0, m.At))
			}
		case "identify":
			e.identify(p, m)
		case "cancel":
			p.mu.Lock()
			cancel := p.cancels[m.ID]
			delete(p.cancels, m.ID)
			p.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		default:
			r.Broken(fmt.Errorf("child %q: %w: a %q message goes to a child, not from one", p.id, ErrGarbage, m.T))
		}
	}
}

func (e *Exec) identify(p *execProc, m msg) {
	id := m.ID
	grant := func(notBefore time.Time) {
		p.mu.Lock()
		delete(p.cancels, id)
		p.mu.Unlock()
		g := msg{T: "grant", ID: id}
		if !notBefore.IsZero() {
			g.NotBefore = notBefore.UnixNano()
		}
		p.w.send(g)
	}
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	var (
		now       bool
		notBefore time.Time
		cancel    func()
	)
	if fp, ok := e.Pacer.(FloorPacer); ok {
		now, notBefore, cancel = fp.RequestFloor(m.Shard, m.Operator, grant)
	} else {
		now, cancel = e.Pacer.Request(m.Shard, m.Operator, func() { grant(time.Time{}) })
	}
	if now {
		grant(notBefore)
		return
	}
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		cancel()
		return
	}
	p.cancels[id] = cancel
	p.mu.Unlock()
}

// Output writes the children's output lines to one writer, each line
// prefixed "[child ID] ". It never blocks a child nor the parent: each
// child's lines queue (up to a bound, per child) for one writer goroutine,
// which takes them in turn, one line of each child that has some; when a
// child's queue is full its lines are dropped and counted, the count said
// in a line of its own once its queue is empty again. A child that floods
// thus loses its own lines, never another child's.
type Output struct {
	w    io.Writer
	wake chan struct{} // a line was queued (buffered: 1)
	done chan struct{}

	mu      sync.Mutex
	queues  map[string]*outQueue
	order   []string // the children, in the order of their first line
	closing bool
}

type outQueue struct {
	lines   [][]byte
	dropped int
}

// outputQueue bounds the lines waiting for the writer, per child; maxLine
// bounds a line (a longer one is cut into several).
const (
	outputQueue = 256
	maxLine     = 4096
)

// NewOutput starts the writer to w; Close stops it.
func NewOutput(w io.Writer) *Output {
	o := &Output{w: w, wake: make(chan struct{}, 1), done: make(chan struct{}), queues: map[string]*outQueue{}}
	go o.run()
	return o
}

func (o *Output) run() {
	defer close(o.done)
	var batch [][]byte
	for {
		batch = batch[:0]
		o.mu.Lock()
		for _, id := range o.order {
			q := o.queues[id]
			switch {
			case len(q.lines) > 0:
				batch = append(batch, q.lines[0])
				q.lines[0] = nil
				q.lines = q.lines[1:]
			case q.dropped > 0:
				batch = append(batch, fmt.Appendf(nil, "[child %s] (%d lines dropped: the child wrote faster than stderr took them)\n", id, q.dropped))
				q.dropped = 0
			}
		}
		closing := o.closing
		o.mu.Unlock()
		for _, b := range batch {
			o.w.Write(b)
		}
		if len(batch) == 0 {
			if closing {
				return
			}
			<-o.wake
		}
	}
}

// Close writes the lines queued and stops the writer. Call it after every
// copy ended.
func (o *Output) Close() {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	<-o.done
}

func (o *Output) copy(id string, r io.Reader) {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			o.line(id, line)
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}

func (o *Output) line(id string, line []byte) {
	b := make([]byte, 0, len(id)+len(line)+10)
	b = append(append(append(b, "[child "...), id...), "] "...)
	b = append(b, line...)
	if b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	o.mu.Lock()
	q := o.queues[id]
	if q == nil {
		q = &outQueue{}
		o.queues[id] = q
		o.order = append(o.order, id)
	}
	if len(q.lines) < outputQueue {
		q.lines = append(q.lines, b)
	} else {
		q.dropped++
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}
