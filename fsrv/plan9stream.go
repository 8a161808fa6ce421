package fsrv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"

	"9fans.net/go/plan9"
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

	// maxMsize caps the msize of a Tversion inside a session.
	maxMsize uint32
	// again is the Tversion that ended srv9p's session, to start the next
	// one with; read state.
	again []byte
}

func newPlan9Stream(in io.Reader, w io.Writer, c io.Closer, t *tracker, sess *session, first []byte, maxMsize uint32) *plan9Stream {
	t.start(frameTag(first), request{typ: msgTversion})
	return &plan9Stream{
		frameReader: frameReader{r: bufio.NewReaderSize(in, 64<<10), t: t, pend: first},
		w:           w, c: c, sess: sess, maxMsize: maxMsize,
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
		// version(5): a Tversion inside a session aborts the requests in
		// flight and clunks every fid. srv9p does neither, so its session
		// ends here and a new one starts with this Tversion (see
		// reversion); srv9p takes the smaller of its msize and this one.
		s.again = versionFrame(msgTversion, t.tag, min(t.msize, s.maxMsize), t.version)
		return errReversion
	}
	refuse := func(err error) error {
		if _, derr := s.r.Discard(body); derr != nil {
			return derr
		}
		return s.inject(rerror(tag, clipEname(ename(err), msize)))
	}
	if !plan9Request(typ) {
		// Topenfd (plan9port's 98) and any other type srv9p cannot
		// decode: srv9p would print "bad fcall" and drop the connection.
		return refuse(fmt.Errorf("%w: unknown message type %d", fs.ErrInvalid, typ))
	}
	var req request
	if typ == msgTwrite {
		// Only the count is checked; the data passes through.
		fixed, err := s.r.Peek(min(body, twriteFixed))
		if err != nil {
			return err
		}
		if body < twriteFixed || binary.LittleEndian.Uint32(fixed[12:]) != uint32(body-twriteFixed) {
			return refuse(errMalformed)
		}
		req = parseRequest(typ, fixed, false)
	} else {
		frame, err := s.readWhole(hdr, body)
		if err != nil {
			return err
		}
		if !wellFormed9(typ, frame[headerSize:]) {
			return s.inject(rerror(tag, clipEname(ename(errMalformed), msize)))
		}
		if err := s.t.start(tag, parseRequest(typ, frame[headerSize:], false)); err != nil {
			if errors.Is(err, errTooManyFids) {
				return s.inject(rerror(tag, clipEname(ename(err), msize)))
			}
			return err
		}
		s.pend = frame
		return nil
	}
	err = s.pass(hdr, body, req)
	if errors.Is(err, errTooManyFids) {
		return s.inject(rerror(tag, clipEname(ename(err), msize)))
	}
	return err
}

// 9P2000 request types that only this engine looks at.
const (
	msgTerror  = 106 // not a request: there is no Terror
	msgTopen   = 112
	msgTcreate = 114
	msgTread   = 116
	msgTstat   = 124
	msgTwstat  = 126
)

// errReversion ends srv9p's session at a Tversion inside it.
var errReversion = errors.New("fsrv: Tversion inside a session")

// errMalformed refuses a request whose fields do not fill its frame.
var errMalformed = fmt.Errorf("%w: malformed message", fs.ErrInvalid)

// reversion readies the stream for a new srv9p session after a Tversion
// ended the last one (again): it starts with that Tversion, no fid and no
// request in flight. The caller has waited for the old session's
// callbacks.
func (s *plan9Stream) reversion() {
	frame := s.again
	s.again = nil
	s.t.reset()
	s.t.start(frameTag(frame), request{typ: msgTversion})
	s.sess.msize.Store(binary.LittleEndian.Uint32(frame[headerSize:]))
	s.sess.ending.Store(false)
	s.pend = frame
}

// plan9Request reports whether typ is a 9P2000 request.
func plan9Request(typ uint8) bool {
	return typ >= msgTversion && typ < msgTversion+28 && typ%2 == 0 && typ != msgTerror
}

// wellFormed9 reports whether body holds exactly the fields of a 9P2000
// request of type typ (intro(5)), as 9fans.net/go/plan9 decodes them, so
// that srv9p never sees a frame it cannot decode.
func wellFormed9(typ uint8, b []byte) bool {
	ok := true
	take := func(n int) {
		if len(b) < n {
			ok, b = false, nil
			return
		}
		b = b[n:]
	}
	str := func() {
		if len(b) < 2 {
			ok, b = false, nil
			return
		}
		take(2 + int(binary.LittleEndian.Uint16(b)))
	}
	switch typ {
	case msgTflush:
		take(2)
	case msgTauth:
		take(4)
		str()
		str()
	case msgTattach:
		take(8)
		str()
		str()
	case msgTwalk:
		take(8)
		if len(b) < 2 || binary.LittleEndian.Uint16(b) > plan9.MAXWELEM {
			return false
		}
		n := int(binary.LittleEndian.Uint16(b))
		take(2)
		for range n {
			str()
		}
	case msgTopen:
		take(5)
	case msgTcreate:
		take(4)
		str()
		take(5)
	case msgTread:
		take(16)
	case msgTclunk, msgTremove, msgTstat:
		take(4)
	case msgTwstat:
		take(4)
		str()
	default:
		return false
	}
	return ok && len(b) == 0
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
