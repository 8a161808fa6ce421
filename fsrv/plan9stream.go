package fsrv

import (
	"bufio"
	"encoding/binary"
	"errors"
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
	frameReader
	w    io.Writer
	c    io.Closer
	sess *session

	// wmu serialises the frames srv9p writes (one a Write) with those the
	// stream writes itself.
	wmu sync.Mutex
}

func newPlan9Stream(in io.Reader, w io.Writer, c io.Closer, t *tracker, sess *session, first []byte) *plan9Stream {
	t.start(frameTag(first), request{typ: msgTversion})
	return &plan9Stream{
		frameReader: frameReader{r: bufio.NewReaderSize(in, 64<<10), t: t, pend: first},
		w:           w, c: c, sess: sess,
	}
}

// Read implements io.Reader for srv9p's receive loop.
func (s *plan9Stream) Read(p []byte) (int, error) {
	n, err := s.read(p, s.nextFrame)
	if err != nil {
		s.sess.ending.Store(true) // srv9p now clunks every fid
	}
	return n, err
}

func (s *plan9Stream) nextFrame() error {
	msize := s.sess.msize.Load()
	hdr, typ, tag, body, err := s.header(msize)
	if err != nil {
		return err
	}
	defer s.wholeRead()
	if typ == msgTversion && headerSize+body <= maxVersionFrame {
		frame, t, err := s.readVersion(hdr, body)
		if err != nil {
			if frame != nil {
				s.inject(rerror(tag, clipEname(ename(err), msize)))
			}
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
	err = s.pass(hdr, body, parseRequest(typ, b, false))
	if errors.Is(err, errTooManyFids) {
		return s.inject(rerror(tag, clipEname(ename(err), msize)))
	}
	return err
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
