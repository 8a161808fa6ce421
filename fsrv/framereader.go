package fsrv

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// frameReader is the read half plan9Stream and dotlStream share: the
// engine behind a stream (srv9p, hugelgupf/p9) gets the start of each
// frame from pend and the rest straight from r. The engine reads from one
// goroutine at a time.
type frameReader struct {
	r         *bufio.Reader
	t         *tracker  // requests in flight and fids, bounded
	wd        *watchdog // bounds the time inside one frame; nil: none
	pend      []byte    // start of the current frame, not yet returned
	remaining int       // bytes of the current frame still in r
}

// read is a stream's Read: next reads the next frame's header and either
// queues the frame (pend, remaining) or handles it itself.
func (f *frameReader) read(p []byte, next func() error) (int, error) {
	for len(f.pend) == 0 && f.remaining == 0 {
		if err := next(); err != nil {
			return 0, err
		}
	}
	if len(f.pend) > 0 {
		n := copy(p, f.pend)
		f.pend = f.pend[n:]
		return n, nil
	}
	n, err := f.r.Read(p[:min(len(p), f.remaining)])
	f.remaining -= n
	if f.remaining == 0 {
		f.wd.disarm()
	}
	if err == io.EOF && f.remaining > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// header waits for the next frame (startFrame) and returns its header,
// type, tag and body length; a frame larger than msize is an error. Once
// header succeeds, the caller defers wholeRead.
func (f *frameReader) header(msize uint32) (hdr [headerSize]byte, typ uint8, tag uint16, body int, err error) {
	hdr, err = startFrame(f.r, f.t, f.wd)
	if err != nil {
		return hdr, 0, 0, 0, err
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	if size < headerSize || size > msize {
		return hdr, 0, 0, 0, fmt.Errorf("%w: size %d, msize %d", errFrame, size, msize)
	}
	return hdr, hdr[4], binary.LittleEndian.Uint16(hdr[5:]), int(size) - headerSize, nil
}

// wholeRead disarms the watchdog unless part of the frame is still to be
// read: frames a stream handles itself are read whole.
func (f *frameReader) wholeRead() {
	if f.remaining == 0 {
		f.wd.disarm()
	}
}

// readWhole reads the rest of the frame hdr starts into a new buffer.
func (f *frameReader) readWhole(hdr [headerSize]byte, body int) ([]byte, error) {
	frame := make([]byte, headerSize+body)
	copy(frame, hdr[:])
	if _, err := io.ReadFull(f.r, frame[headerSize:]); err != nil {
		return nil, err
	}
	return frame, nil
}

// readVersion reads the rest of a Tversion and parses it; an msize below
// MinMsize is fs.ErrInvalid. A non-nil frame with an error is a Tversion
// to refuse on its tag; a nil one, a connection that broke.
func (f *frameReader) readVersion(hdr [headerSize]byte, body int) ([]byte, tversion, error) {
	frame, err := f.readWhole(hdr, body)
	if err != nil {
		return nil, tversion{}, err
	}
	t, err := parseVersion(frame)
	if err == nil && t.msize < MinMsize {
		err = fmt.Errorf("%w: msize %d is below the minimum %d", fs.ErrInvalid, t.msize, MinMsize)
	}
	return frame, t, err
}

// pass records req and queues its frame for the engine. A fid past
// MaxFids is errTooManyFids with the frame discarded, for the caller to
// refuse on the request's tag; any other error ends the connection.
func (f *frameReader) pass(hdr [headerSize]byte, body int, req request) error {
	tag := binary.LittleEndian.Uint16(hdr[5:])
	if err := f.t.start(tag, req); err != nil {
		if !errors.Is(err, errTooManyFids) {
			return err
		}
		if _, derr := f.r.Discard(body); derr != nil {
			return derr
		}
		return err
	}
	f.pend = append(f.pend[:0], hdr[:]...)
	f.remaining = body
	return nil
}

// startFrame waits until the connection may have one more request in
// flight and the next frame begins, then arms the watchdog unless the
// whole frame is already here. It returns the frame's header.
func startFrame(r *bufio.Reader, t *tracker, wd *watchdog) (hdr [headerSize]byte, err error) {
	if !t.wait() {
		return hdr, errConnClosed
	}
	// Between messages a connection may idle as long as it likes.
	if _, err := r.Peek(1); err != nil {
		return hdr, err
	}
	if b, _ := r.Peek(r.Buffered()); len(b) < 4 || len(b) < int(binary.LittleEndian.Uint32(b)) {
		wd.arm()
	}
	_, err = io.ReadFull(r, hdr[:])
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return hdr, err
}
