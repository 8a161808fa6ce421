package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
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
	// (Tree.Line); nil drops them. A line's bytes are valid only until
	// Lines returns: copy what is kept.
	Lines func(child, kind string, line []byte)
	// Sessions receives each new session a child reports (Tree.Session).
	Sessions func(child string, shard int, s core.Session, seq int64)
	// Limits receives the session start limit a child's discovery
	// learnt (the shared pacer's SetStartLimit, which lowers what
	// remains, never raises it); nil drops it.
	Limits func(child string, l core.StartLimit)
	// States receives each shard's state a child pushes (Tree.State),
	// with the generation of the child that sent it.
	States func(child string, gen, shard int, st ShardState)
	// Logger logs the messages refused (nil: none).
	Logger *slog.Logger

	wg   sync.WaitGroup
	outs sync.WaitGroup // the copies of the children's stdout and stderr
}

// Wait waits for the goroutines of every child launched, which end once
// their process has exited, and for the copies of their output, at most
// outputDrain past that: a grandchild may hold a child's stdout open for
// as long as it lives.
func (e *Exec) Wait() {
	e.wg.Wait()
	copied := make(chan struct{})
	go func() { e.outs.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(outputDrain):
	}
}

// outputDrain bounds the wait for the children's last output lines.
const outputDrain = 2 * time.Second

type execProc struct {
	id   string
	gen  int
	owns map[int]bool // its block
	// sockets are the unix sockets the parent told it to listen on
	// (--listen unix!PATH): the only paths its ready may name.
	sockets []string
	cmd     *exec.Cmd
	conn    net.Conn // control
	data    net.Conn
	w       *msgWriter
	reaped  chan struct{} // closed once waitpid returned
	read    chan struct{} // closed when the channel's reader ended

	mu      sync.Mutex
	cancels map[uint64]func()
	asking  map[int]uint64 // shard → its one outstanding identify request
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
	conn, childEnd, err := channelPair()
	if err != nil {
		return nil, fmt.Errorf("child %q: control channel: %w", l.ID, err)
	}
	defer childEnd.Close()
	dataConn, childData, err := channelPair()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("child %q: data channel: %w", l.ID, err)
	}
	defer childData.Close()
	fail := func(err error) (Process, error) {
		conn.Close()
		dataConn.Close()
		return nil, fmt.Errorf("child %q: %w", l.ID, err)
	}
	tokR, tokW, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("token pipe: %w", err))
	}
	defer tokR.Close()
	_, err = tokW.WriteString(e.Token) // a pipe holds 64 KiB; a token at most 4 KiB
	tokW.Close()
	if err != nil {
		return fail(fmt.Errorf("token pipe: %w", err))
	}
	// Our own pipes for stdout and stderr, not exec's: cmd.Wait would
	// wait for them to reach EOF, which a grandchild that inherited them
	// delays for as long as it lives, and the child would stay a zombie
	// (and "starting") meanwhile. The readers end on their own.
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fail(err)
	}
	args := e.Args(l)
	cmd := exec.Command(e.Path, args...)
	cmd.Env = append(append([]string(nil), e.Env...), TokenFDVar+"=3", ChannelFDVar+"=4", DataFDVar+"=5")
	cmd.ExtraFiles = []*os.File{tokR, childEnd, childData}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return fail(err)
	}
	owns := make(map[int]bool, len(l.Shards))
	for _, id := range l.Shards {
		owns[id] = true
	}
	p := &execProc{id: l.ID, gen: l.Generation, owns: owns, sockets: listenSockets(args), cmd: cmd, conn: conn, data: dataConn, w: &msgWriter{w: conn}, reaped: make(chan struct{}), read: make(chan struct{}), cancels: map[uint64]func(){}, asking: map[int]uint64{}}
	e.outs.Go(func() { e.Output.copy(l.ID, outR); outR.Close() })
	e.outs.Go(func() { e.Output.copy(l.ID, errR); errR.Close() })
	var readers sync.WaitGroup
	readers.Go(func() { e.channel(p, r) })
	readers.Go(func() { e.dataStream(p, r) })
	e.wg.Go(func() {
		readers.Wait()
		close(p.read)
	})
	e.wg.Go(func() {
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
		// inherited the child's end (the child's descriptors are close
		// on exec) could hold it open: after channelDrain it is cut.
		select {
		case <-p.read:
		case <-time.After(channelDrain):
			r.Broken(fmt.Errorf("child %q exited, but its private channel did not end within %v", p.id, channelDrain))
			conn.Close()
			dataConn.Close()
			<-p.read
		}
		conn.Close()
		dataConn.Close()
		r.Exited(err)
	})
	return p, nil
}

// channelPair returns the parent's end of a new socketpair and the
// child's (close on exec in the parent; exec.Cmd clears that flag on the
// child's copy, and the child sets it again, see channelFile).
func channelPair() (net.Conn, *os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	parentEnd, childEnd := os.NewFile(uintptr(pair[0]), "channel"), os.NewFile(uintptr(pair[1]), "channel")
	conn, err := net.FileConn(parentEnd)
	parentEnd.Close()
	if err != nil {
		childEnd.Close()
		return nil, nil, err
	}
	return conn, childEnd, nil
}

// channelDrain bounds the reading of a channel after its child's exit.
const channelDrain = 5 * time.Second

// ended handles the end of one of a child's streams: garbage breaks the
// child; an end that the child's exit does not follow is a child that
// closed its channel.
func ended(p *execProc, r *Reports, c net.Conn, err error) {
	if errors.Is(err, ErrGarbage) && !errors.Is(err, errCutShort) {
		r.Broken(fmt.Errorf("child %q: %w", p.id, err))
		io.Copy(io.Discard, c) // the child must not block on it
		return
	}
	// The end of the channel comes with the child's exit (killed, it may
	// cut its last line); alone, it is a child that closed it.
	select {
	case <-p.reaped:
	case <-time.After(2 * time.Second):
		r.Broken(fmt.Errorf("child %q closed its private channel", p.id))
	}
}

// dataStream reads the child's copies of its logs' lines until the
// stream ends.
func (e *Exec) dataStream(p *execProc, r *Reports) {
	mr := newMsgReader(p.data)
	for {
		m, err := mr.next()
		if err != nil {
			ended(p, r, p.data, err)
			return
		}
		if m.T != "dispatch" && m.T != "event" {
			ended(p, r, p.data, fmt.Errorf("%w: a %q message on the data stream", ErrGarbage, m.T))
			return
		}
		if e.Lines != nil {
			e.Lines(p.id, m.T, m.Raw)
		}
	}
}

// listenSockets returns the paths of the unix sockets in args' --listen
// flags.
func listenSockets(args []string) []string {
	var paths []string
	for i, a := range args {
		var v string
		switch {
		case a == "--listen" && i+1 < len(args):
			v = args[i+1]
		case strings.HasPrefix(a, "--listen="):
			v = strings.TrimPrefix(a, "--listen=")
		default:
			continue
		}
		if path, ok := strings.CutPrefix(v, "unix!"); ok {
			paths = append(paths, path)
		}
	}
	return paths
}

// refuse logs a control message a child sent about a shard outside its
// block, or with figures that cannot be, and drops it: a child speaks for
// its own block only, and one buggy child must not spend the shared
// budget or move the others' pacing.
func (e *Exec) refuse(p *execProc, m msg, why string) {
	if e.Logger != nil {
		e.Logger.Warn("refused a message on a child's private channel", "child", p.id, "type", m.T, "shard", m.Shard, "why", why)
	}
}

// channel reads the child's control messages until the stream ends.
func (e *Exec) channel(p *execProc, r *Reports) {
	mr := newControlReader(p.conn)
	for {
		m, err := mr.next()
		if err != nil {
			ended(p, r, p.conn, err)
			return
		}
		r.Alive()
		switch m.T {
		case "ready":
			// The parent forwards reads and operator commands for the
			// child's shards to this path: one the parent did not choose
			// would send them to another process (the re-attack on issue
			// 23 pointed one at another supervise's child).
			if len(p.sockets) > 0 && !slices.Contains(p.sockets, m.Socket) {
				e.refuse(p, m, fmt.Sprintf("a socket the parent did not assign: %q", m.Socket))
				continue
			}
			r.Ready(m.Socket)
		case "status":
			if m.Total > 0 && m.Ready == m.Total {
				r.Settled()
			}
		case "alive":
		case "shard":
			switch {
			case !p.owns[m.Shard]:
				e.refuse(p, m, "not in its block")
			case !slices.Contains(shardStates, m.State):
				e.refuse(p, m, "no such state")
			case impossibleFigures(m) != "":
				e.refuse(p, m, impossibleFigures(m))
			case e.States != nil:
				e.States(p.id, p.gen, m.Shard, ShardState{State: m.State, Seq: m.Seq, NoSeq: m.NoSeq, Reconnects: m.Reconnects, LatencyMs: m.LatencyMs})
			}
		case "session":
			if e.Sessions != nil {
				e.Sessions(p.id, m.Shard, core.Session{ID: m.SID, ResumeURL: m.URL}, m.Seq)
			}
		case "limit":
			// A reset past a day cannot be (the platforms' budget is a
			// day's), and would hold every child's identifies back that
			// long (the attack on issue 23 forged one of 1e15 ms).
			if m.Total <= 0 || m.Remaining < 0 || m.Remaining > m.Total || m.MaxConc < 0 || m.ResetAfterMs < 0 ||
				m.ResetAfterMs > (core.DiscordStartPeriod+time.Hour).Milliseconds() {
				e.refuse(p, m, fmt.Sprintf("a limit that cannot be: total %d remaining %d max_concurrency %d reset_after_ms %d", m.Total, m.Remaining, m.MaxConc, m.ResetAfterMs))
				continue
			}
			if e.Limits != nil {
				e.Limits(p.id, core.StartLimit{Total: m.Total, Remaining: m.Remaining, ResetAfter: time.Duration(m.ResetAfterMs) * time.Millisecond, MaxConcurrency: m.MaxConc})
			}
		case "written":
			if !p.owns[m.Shard] {
				e.refuse(p, m, "not in its block")
				continue
			}
			if fp, ok := e.Pacer.(FloorPacer); ok {
				fp.Written(m.Shard, time.Unix(0, m.At))
			}
		case "identify":
			if !p.owns[m.Shard] {
				e.refuse(p, m, "not in its block")
				continue
			}
			e.identify(p, m)
		case "cancel":
			p.mu.Lock()
			cancel := p.cancels[m.ID]
			delete(p.cancels, m.ID)
			for shard, id := range p.asking {
				if id == m.ID {
					delete(p.asking, shard)
				}
			}
			p.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		default:
			ended(p, r, p.conn, fmt.Errorf("%w: a %q message goes to a child or on the data stream, not on a child's control stream", ErrGarbage, m.T))
			return
		}
	}
}

// impossibleFigures says what in a shard message cannot be (the attack
// on issue 23 had /status show sequence -5, 2^64-1 reconnects and a
// latency of -1), or "".
func impossibleFigures(m msg) string {
	switch {
	case !m.NoSeq && m.Seq < 0:
		return fmt.Sprintf("a negative sequence %d", m.Seq)
	case m.Reconnects > maxReconnects:
		return fmt.Sprintf("%d reconnects: more than one a microsecond for 8 years", m.Reconnects)
	case m.LatencyMs < 0 || m.LatencyMs > maxLatency.Milliseconds():
		// A heartbeat unanswered that long closed the connection long
		// before (Discord's interval is about 41 s).
		return fmt.Sprintf("a latency of %d ms", m.LatencyMs)
	}
	return ""
}

const (
	maxReconnects = 1 << 48
	maxLatency    = time.Hour
)

// shardStates are the words a shard's state may be.
var shardStates = []string{"ASSIGNED", "STARTING", "READY", "BACKOFF", "FATAL", "STOPPED"}

// identify asks the shared pacer for child p's request m. A shard has one
// outstanding request at most: a child's core asks again only after its
// grant or cancel, so a second request cancels the first (logged), and a
// child that repeats its requests cannot drain the shared budget (the
// attack on issue 23 queued 50 for one shard, granted one every 5 s).
func (e *Exec) identify(p *execProc, m msg) {
	id := m.ID
	grant := func(notBefore time.Time) {
		p.mu.Lock()
		delete(p.cancels, id)
		if p.asking[m.Shard] == id {
			delete(p.asking, m.Shard)
		}
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
	prev, asked := p.asking[m.Shard]
	earlier := p.cancels[prev]
	if asked {
		delete(p.cancels, prev)
	}
	p.asking[m.Shard] = id
	p.mu.Unlock()
	if asked {
		e.refuse(p, m, fmt.Sprintf("a second identify request for the shard while request %d waits: that one is cancelled", prev))
		if earlier != nil {
			earlier()
		}
	}
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
