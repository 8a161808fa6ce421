package fsrv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
)

// plan9Stream sits between a connection and srv9p, as dotlStream does for
// 9P2000.L. It passes frames through, counting requests and fids on the
// way (see tracker): it stops reading while MaxRequests are in flight,
// refuses a fid past MaxFids itself, ends the connection on a tag reused
// in flight, keeps the session's msize (which error strings must fit) and
// refuses a Tversion below MinMsize as the first one is refused.
type plan9Stream struct {
	r    *bufio.Reader
	w    io.Writer
	c    io.Closer
	t    *tracker
	wd   *watchdog
	sess *session

	// Read state; srv9p reads from one goroutine.
	pend      []byte
	remaining int

	// wmu serialises the frames srv9p writes (one a Write) with those the
	// stream writes itself.
	wmu sync.Mutex
}

func newPlan9Stream(in io.Reader, w io.Writer, c io.Closer, t *tracker, sess *session, first []byte) *plan9Stream {
	t.start(frameTag(first), request{typ: msgTversion})
	return &plan9Stream{r: bufio.NewReaderSize(in, 64<<10), w: w, c: c, t: t, sess: sess, pend: first}
}

// Read implements io.Reader for srv9p's receive loop.
func (s *plan9Stream) Read(p []byte) (int, error) {
	for len(s.pend) == 0 && s.remaining == 0 {
		if err := s.nextFrame(); err != nil {
			s.sess.ending.Store(true) // srv9p now clunks every fid
			return 0, err
		}
	}
	if len(s.pend) > 0 {
		n := copy(p, s.pend)
		s.pend = s.pend[n:]
		return n, nil
	}
	n, err := s.r.Read(p[:min(len(p), s.remaining)])
	s.remaining -= n
	if s.remaining == 0 {
		s.wd.disarm()
	}
	if err == io.EOF && s.remaining > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		s.sess.ending.Store(true)
	}
	return n, err
}

func (s *plan9Stream) nextFrame() error {
	hdr, err := startFrame(s.r, s.t, s.wd)
	if err != nil {
		return err
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	typ, tag := hdr[4], binary.LittleEndian.Uint16(hdr[5:])
	msize := s.sess.msize.Load()
	if size < headerSize || size > msize {
		return fmt.Errorf("%w: size %d, msize %d", errFrame, size, msize)
	}
	body := int(size) - headerSize
	defer func() {
		if s.remaining == 0 {
			s.wd.disarm()
		}
	}()
	if typ == msgTversion && size <= maxVersionFrame {
		frame := make([]byte, size)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(s.r, frame[headerSize:]); err != nil {
			return err
		}
		t, err := parseVersion(frame)
		if err == nil && t.msize < MinMsize {
			err = fmt.Errorf("%w: msize %d is below the minimum %d", fs.ErrInvalid, t.msize, MinMsize)
		}
		if err != nil {
			s.inject(rerror(tag, clipEname(ename(err), msize)))
			return err
		}
		if err := s.t.start(tag, request{typ: typ}); err != nil {
			return err
		}
		// srv9p takes the smaller of this and the current msize.
		s.sess.msize.Store(min(t.msize, msize))
		s.pend = frame
		return nil
	}
	b, err := s.r.Peek(min(body, fidPrefix))
	if err != nil {
		return err
	}
	if err := s.t.start(tag, parseRequest(typ, b, false)); err != nil {
		if !errors.Is(err, errTooManyFids) {
			return err
		}
		if _, err := s.r.Discard(body); err != nil {
			return err
		}
		return s.inject(rerror(tag, clipEname(ename(err), msize)))
	}
	s.pend = append(s.pend[:0], hdr[:]...)
	s.remaining = body
	return nil
}

// inject writes a reply the stream makes itself.
func (s *plan9Stream) inject(frame []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.w.Write(frame)
	return err
}

// Write implements io.Writer for srv9p, which writes one whole reply a
// call.
func (s *plan9Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if len(p) >= headerSize && int(binary.LittleEndian.Uint32(p)) == len(p) {
		s.t.finish(p)
	}
	return s.w.Write(p)
}

// Close closes the connection; srv9p closes its input when it is done.
func (s *plan9Stream) Close() error {
	s.sess.ending.Store(true)
	err := s.c.Close()
	if errors.Is(err, fs.ErrClosed) {
		return nil
	}
	return err
}
