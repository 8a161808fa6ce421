package fsrv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/hugelgupf/p9/linux"
)

// Wire constants shared by both dialects.
const (
	msgTlerror  = 6
	msgRlerror  = 7
	msgTversion = 100
	msgRversion = 101
	msgTauth    = 102
	msgRerror   = 107

	noTag = 0xFFFF

	// headerSize is size[4] type[1] tag[2].
	headerSize = 7

	// maxVersionFrame bounds the first message: a Tversion is 13 bytes
	// plus its version string, which is a few bytes in every client.
	maxVersionFrame = 512

	// MinMsize is the smallest message size a client may negotiate (as in
	// Plan 9's lib9p): below it a walk reply of 16 QIDs does not fit.
	MinMsize = 256

	// DefaultMaxMsize caps the negotiated message size when
	// Server.MaxMsize is zero. Linux v9fs asks for 128 KiB by default; a
	// larger msize costs memory per connection on the 9P2000.L engine.
	DefaultMaxMsize = 256 << 10
)

// dialect says which engine serves a connection.
type dialect int

const (
	dialectUnknown dialect = iota
	dialectDotL            // 9P2000.L and 9P2000.L.Google.N: hugelgupf/p9
	dialect9P2000          // 9P2000, 9P2000.u and other 9P2000.x: srv9p
)

// dialectOf chooses the engine for a Tversion version string.
func dialectOf(version string) dialect {
	switch {
	case version == "9P2000.L" || strings.HasPrefix(version, "9P2000.L."):
		return dialectDotL
	case version == "9P2000" || strings.HasPrefix(version, "9P2000."):
		return dialect9P2000
	}
	return dialectUnknown
}

// errFrame reports a frame whose size field cannot be right; the stream can
// no longer be trusted, so the connection is dropped without a reply.
var errFrame = errors.New("fsrv: malformed 9P frame")

// tversion is a decoded Tversion.
type tversion struct {
	tag     uint16
	msize   uint32
	version string
}

// readFrame reads one whole frame of at most limit bytes.
func readFrame(r io.Reader, limit uint32) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	if size < headerSize || size > limit {
		return nil, fmt.Errorf("%w: size %d", errFrame, size)
	}
	frame := make([]byte, size)
	copy(frame, hdr[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return frame, nil
}

// errNotVersion means the first message was a frame but not a Tversion.
var errNotVersion = fmt.Errorf("%w: the first message must be Tversion", fs.ErrInvalid)

// parseVersion decodes a whole frame as a Tversion.
func parseVersion(frame []byte) (tversion, error) {
	if len(frame) < headerSize+4+2 || frame[4] != msgTversion {
		return tversion{}, errNotVersion
	}
	t := tversion{
		tag:   binary.LittleEndian.Uint16(frame[5:]),
		msize: binary.LittleEndian.Uint32(frame[7:]),
	}
	n := int(binary.LittleEndian.Uint16(frame[11:]))
	if len(frame) != 13+n {
		return tversion{}, fmt.Errorf("%w: malformed Tversion", fs.ErrInvalid)
	}
	t.version = string(frame[13:])
	return t, nil
}

// frameTag returns the tag of a frame that has a header.
func frameTag(frame []byte) uint16 {
	if len(frame) < headerSize {
		return noTag
	}
	return binary.LittleEndian.Uint16(frame[5:])
}

// newFrame starts a frame of type typ; finish fills in its size.
func newFrame(typ uint8, tag uint16) []byte {
	b := make([]byte, headerSize, 64)
	b[4] = typ
	binary.LittleEndian.PutUint16(b[5:], tag)
	return b
}

func finish(b []byte) []byte {
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

func putString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// versionFrame encodes a Tversion or Rversion.
func versionFrame(typ uint8, tag uint16, msize uint32, version string) []byte {
	b := newFrame(typ, tag)
	b = binary.LittleEndian.AppendUint32(b, msize)
	return finish(putString(b, version))
}

// rlerror encodes a 9P2000.L error reply.
func rlerror(tag uint16, e linux.Errno) []byte {
	return finish(binary.LittleEndian.AppendUint32(newFrame(msgRlerror, tag), uint32(e)))
}

// rerror encodes a 9P2000 error reply.
func rerror(tag uint16, ename string) []byte {
	return finish(putString(newFrame(msgRerror, tag), ename))
}

// errorFrame encodes err in the dialect d (9P2000 when unknown).
func errorFrame(d dialect, tag uint16, err error) []byte {
	if d == dialectDotL {
		return rlerror(tag, errno(err))
	}
	// Before negotiation the client's msize is not known; MinMsize is
	// the least it can be.
	return rerror(tag, clipEname(ename(err), MinMsize))
}

// negotiation is the outcome of sniffing a connection's first messages.
type negotiation struct {
	dialect dialect
	// first is the Tversion to hand to the engine, its msize capped.
	first []byte
	msize uint32
}

// sniff reads Tversion messages from r until one names a dialect fsrv
// speaks. It answers an unknown version with Rversion "unknown" (the client
// may try another), and anything else with an error reply, writing replies
// to w. It returns an error when the connection must be dropped.
func sniff(r io.Reader, w io.Writer, maxMsize uint32) (negotiation, error) {
	// A client that keeps proposing versions we do not speak is given a
	// few tries, not a stream.
	for range 8 {
		frame, err := readFrame(r, maxVersionFrame)
		if err != nil {
			return negotiation{}, err
		}
		t, err := parseVersion(frame)
		if err != nil {
			w.Write(errorFrame(dialectUnknown, frameTag(frame), err))
			return negotiation{}, err
		}
		d := dialectOf(t.version)
		msize := min(t.msize, maxMsize)
		if d == dialectUnknown {
			// version(5): a server that does not understand the version
			// replies Rversion "unknown", not Rerror.
			if _, err := w.Write(versionFrame(msgRversion, t.tag, msize, "unknown")); err != nil {
				return negotiation{}, err
			}
			continue
		}
		if t.msize < MinMsize {
			err := fmt.Errorf("%w: msize %d is below the minimum %d", fs.ErrInvalid, t.msize, MinMsize)
			w.Write(errorFrame(d, t.tag, err))
			return negotiation{}, err
		}
		return negotiation{
			dialect: d,
			first:   versionFrame(msgTversion, t.tag, msize, t.version),
			msize:   msize,
		}, nil
	}
	return negotiation{}, fmt.Errorf("%w: no known version offered", fs.ErrInvalid)
}
