package fsrv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"9fans.net/go/plan9"
)

// A small 9P2000.L codec for the transcript tests, in the text form of
// 9fans.net/go/plan9.ParseFcall: "Tname field value field value ...". A
// value is a word, a 'literal', a Go "quoted string", or a [list]. QIDs are
// written path.version[.d]; flags and masks may be written symbolically
// (O_WRONLY|O_TRUNC, SIZE|MTIME, BASIC), errnos by name (ENOENT).

type fieldKind int

const (
	kU16 fieldKind = iota
	kU32
	kU64
	kFid    // u32, NOFID allowed
	kStr    // string[2]
	kStrs   // nwname[2] wname[s]...
	kQid    // qid[13]
	kQids   // nwqid[2] qid[13]...
	kData   // count[4] data[count]
	kEnts   // count[4] dirents
	kErrno  // u32
	kOflags // u32 open flags
	kSetMsk // u32 setattr valid
	kGetMsk // u64 getattr mask
	kMode   // u32, octal
	kU8
)

type field struct {
	name string
	kind fieldKind
}

type msgSpec struct {
	name   string
	fields []field
}

var attrFields = []field{
	{"mode", kMode}, {"uid", kU32}, {"gid", kU32}, {"nlink", kU64}, {"rdev", kU64},
	{"size", kU64}, {"blksize", kU64}, {"blocks", kU64},
	{"atime", kU64}, {"atimens", kU64}, {"mtime", kU64}, {"mtimens", kU64},
	{"ctime", kU64}, {"ctimens", kU64}, {"btime", kU64}, {"btimens", kU64},
	{"gen", kU64}, {"dataversion", kU64},
}

func concat(fs ...[]field) []field {
	var out []field
	for _, f := range fs {
		out = append(out, f...)
	}
	return out
}

var dotlSpecs = map[uint8]msgSpec{
	7:   {"Rlerror", []field{{"ecode", kErrno}}},
	8:   {"Tstatfs", []field{{"fid", kFid}}},
	9:   {"Rstatfs", []field{{"type", kU32}, {"bsize", kU32}, {"blocks", kU64}, {"bfree", kU64}, {"bavail", kU64}, {"files", kU64}, {"ffree", kU64}, {"fsid", kU64}, {"namelen", kU32}}},
	12:  {"Tlopen", []field{{"fid", kFid}, {"flags", kOflags}}},
	13:  {"Rlopen", []field{{"qid", kQid}, {"iounit", kU32}}},
	14:  {"Tlcreate", []field{{"fid", kFid}, {"name", kStr}, {"flags", kOflags}, {"mode", kMode}, {"gid", kU32}}},
	15:  {"Rlcreate", []field{{"qid", kQid}, {"iounit", kU32}}},
	16:  {"Tsymlink", []field{{"fid", kFid}, {"name", kStr}, {"symtgt", kStr}, {"gid", kU32}}},
	18:  {"Tmknod", []field{{"dfid", kFid}, {"name", kStr}, {"mode", kMode}, {"major", kU32}, {"minor", kU32}, {"gid", kU32}}},
	20:  {"Trename", []field{{"fid", kFid}, {"dfid", kFid}, {"name", kStr}}},
	22:  {"Treadlink", []field{{"fid", kFid}}},
	24:  {"Tgetattr", []field{{"fid", kFid}, {"mask", kGetMsk}}},
	25:  {"Rgetattr", concat([]field{{"valid", kGetMsk}, {"qid", kQid}}, attrFields)},
	26:  {"Tsetattr", []field{{"fid", kFid}, {"valid", kSetMsk}, {"mode", kMode}, {"uid", kU32}, {"gid", kU32}, {"size", kU64}, {"atime", kU64}, {"atimens", kU64}, {"mtime", kU64}, {"mtimens", kU64}}},
	27:  {"Rsetattr", nil},
	30:  {"Txattrwalk", []field{{"fid", kFid}, {"newfid", kFid}, {"name", kStr}}},
	31:  {"Rxattrwalk", []field{{"size", kU64}}},
	32:  {"Txattrcreate", []field{{"fid", kFid}, {"name", kStr}, {"size", kU64}, {"flags", kU32}}},
	33:  {"Rxattrcreate", nil},
	40:  {"Treaddir", []field{{"fid", kFid}, {"offset", kU64}, {"count", kU32}}},
	41:  {"Rreaddir", []field{{"ents", kEnts}}},
	50:  {"Tfsync", []field{{"fid", kFid}}},
	51:  {"Rfsync", nil},
	52:  {"Tlock", []field{{"fid", kFid}, {"type", kU8}, {"flags", kU32}, {"start", kU64}, {"length", kU64}, {"procid", kU32}, {"clientid", kStr}}},
	53:  {"Rlock", []field{{"status", kU8}}},
	54:  {"Tgetlock", []field{{"fid", kFid}, {"type", kU8}, {"start", kU64}, {"length", kU64}, {"procid", kU32}, {"clientid", kStr}}},
	55:  {"Rgetlock", []field{{"type", kU8}, {"start", kU64}, {"length", kU64}, {"procid", kU32}, {"clientid", kStr}}},
	70:  {"Tlink", []field{{"dfid", kFid}, {"fid", kFid}, {"name", kStr}}},
	72:  {"Tmkdir", []field{{"dfid", kFid}, {"name", kStr}, {"mode", kMode}, {"gid", kU32}}},
	73:  {"Rmkdir", []field{{"qid", kQid}}},
	74:  {"Trenameat", []field{{"olddfid", kFid}, {"oldname", kStr}, {"newdfid", kFid}, {"newname", kStr}}},
	75:  {"Rrenameat", nil},
	76:  {"Tunlinkat", []field{{"dfid", kFid}, {"name", kStr}, {"flags", kU32}}},
	77:  {"Runlinkat", nil},
	100: {"Tversion", []field{{"msize", kU32}, {"version", kStr}}},
	101: {"Rversion", []field{{"msize", kU32}, {"version", kStr}}},
	102: {"Tauth", []field{{"afid", kFid}, {"uname", kStr}, {"aname", kStr}, {"nuname", kU32}}},
	104: {"Tattach", []field{{"fid", kFid}, {"afid", kFid}, {"uname", kStr}, {"aname", kStr}, {"nuname", kU32}}},
	105: {"Rattach", []field{{"qid", kQid}}},
	107: {"Rerror", []field{{"ename", kStr}}},
	108: {"Tflush", []field{{"oldtag", kU16}}},
	109: {"Rflush", nil},
	110: {"Twalk", []field{{"fid", kFid}, {"newfid", kFid}, {"wname", kStrs}}},
	111: {"Rwalk", []field{{"wqid", kQids}}},
	116: {"Tread", []field{{"fid", kFid}, {"offset", kU64}, {"count", kU32}}},
	117: {"Rread", []field{{"data", kData}}},
	118: {"Twrite", []field{{"fid", kFid}, {"offset", kU64}, {"data", kData}}},
	119: {"Rwrite", []field{{"count", kU32}}},
	120: {"Tclunk", []field{{"fid", kFid}}},
	121: {"Rclunk", nil},
	122: {"Tremove", []field{{"fid", kFid}}},
	123: {"Rremove", nil},
	126: {"Twalkgetattr", []field{{"fid", kFid}, {"newfid", kFid}, {"wname", kStrs}}},
	127: {"Rwalkgetattr", concat([]field{{"valid", kGetMsk}}, attrFields, []field{{"wqid", kQids}})},
}

var dotlTypes = func() map[string]uint8 {
	m := make(map[string]uint8)
	for t, s := range dotlSpecs {
		m[s.name] = t
	}
	return m
}()

var errnoNames = map[uint32]string{
	1: "EPERM", 2: "ENOENT", 5: "EIO", 9: "EBADF", 13: "EACCES", 16: "EBUSY", 17: "EEXIST",
	20: "ENOTDIR", 21: "EISDIR", 22: "EINVAL", 27: "EFBIG", 38: "ENOSYS", 61: "ENODATA", 95: "EOPNOTSUPP",
}

var oflagNames = []struct {
	name string
	bit  uint32
}{{"O_WRONLY", 1}, {"O_RDWR", 2}, {"O_CREAT", 0100}, {"O_EXCL", 0200}, {"O_TRUNC", 01000}, {"O_APPEND", 02000}, {"O_LARGEFILE", 0100000}}

var setMaskNames = []string{"MODE", "UID", "GID", "SIZE", "ATIME", "MTIME", "CTIME", "ATIME_SET", "MTIME_SET"}

var getMaskNames = []string{"MODE", "NLINK", "UID", "GID", "RDEV", "ATIME", "MTIME", "CTIME", "INO", "SIZE", "BLOCKS", "BTIME", "GEN", "DATA_VERSION"}

const getMaskBasic = 0x7ff

// dotlMsg is a decoded message: each field formatted as text, so that a
// test compares what it wrote.
type dotlMsg struct {
	typ    uint8
	tag    uint16
	fields map[string]string
	order  []string
}

func (m *dotlMsg) String() string {
	var b strings.Builder
	b.WriteString(dotlSpecs[m.typ].name)
	fmt.Fprintf(&b, " tag %d", m.tag)
	for _, f := range m.order {
		fmt.Fprintf(&b, " %s %s", f, m.fields[f])
	}
	return b.String()
}

// tokens splits the fields of a transcript line.
func tokens(s string) ([]string, error) {
	var out []string
	for {
		s = strings.TrimSpace(s)
		if s == "" {
			return out, nil
		}
		var tok string
		switch s[0] {
		case '\'':
			i := strings.IndexByte(s[1:], '\'')
			if i < 0 {
				return nil, errors.New("missing closing quote")
			}
			tok, s = s[:i+2], s[i+2:]
		case '"':
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, err
			}
			tok, s = q, s[len(q):]
		case '[':
			i := strings.IndexByte(s, ']')
			if i < 0 {
				return nil, errors.New("missing ]")
			}
			tok, s = s[:i+1], s[i+1:]
		default:
			tok, s, _ = strings.Cut(s, " ")
		}
		out = append(out, tok)
	}
}

// unquote returns the text of a value token.
func unquote(tok string) (string, error) {
	switch {
	case strings.HasPrefix(tok, "'"):
		return tok[1 : len(tok)-1], nil
	case strings.HasPrefix(tok, `"`):
		return strconv.Unquote(tok)
	}
	return tok, nil
}

func listItems(tok string) []string {
	if strings.HasPrefix(tok, "[") {
		return strings.Fields(tok[1 : len(tok)-1])
	}
	return []string{tok}
}

func parseNum(s string, bits int) (uint64, error) {
	if s == "NOFID" {
		return 0xFFFFFFFF, nil
	}
	if s == "NOTAG" {
		return 0xFFFF, nil
	}
	return strconv.ParseUint(s, 0, bits)
}

func parseFlags(s string, names []string, table map[string]uint64) (uint64, error) {
	if n, err := strconv.ParseUint(s, 0, 64); err == nil {
		return n, nil
	}
	var v uint64
	for _, name := range strings.Split(s, "|") {
		if b, ok := table[name]; ok {
			v |= b
			continue
		}
		i := indexOf(names, name)
		if i < 0 {
			return 0, fmt.Errorf("unknown flag %q", name)
		}
		v |= 1 << i
	}
	return v, nil
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}

// parseDotL parses a transcript line into a message.
func parseDotL(line string) (*dotlMsg, error) {
	toks, err := tokens(line)
	if err != nil {
		return nil, err
	}
	if len(toks) == 0 {
		return nil, errors.New("empty line")
	}
	typ, ok := dotlTypes[toks[0]]
	if !ok {
		return nil, fmt.Errorf("unknown message %q", toks[0])
	}
	m := &dotlMsg{typ: typ, fields: map[string]string{}}
	spec := dotlSpecs[typ]
	for i := 1; i < len(toks); i += 2 {
		if i+1 >= len(toks) {
			return nil, fmt.Errorf("field %q has no value", toks[i])
		}
		name, val := toks[i], toks[i+1]
		if name == "tag" {
			n, err := parseNum(val, 16)
			if err != nil {
				return nil, err
			}
			m.tag = uint16(n)
			continue
		}
		k := -1
		for j, f := range spec.fields {
			if f.name == name {
				k = j
			}
		}
		if k < 0 {
			return nil, fmt.Errorf("%s has no field %q", spec.name, name)
		}
		// Canonicalise by a round trip through the wire form.
		b, err := encodeField(nil, spec.fields[k].kind, val)
		if err != nil {
			return nil, fmt.Errorf("field %s: %v", name, err)
		}
		s, _, err := decodeField(b, spec.fields[k].kind, nil)
		if err != nil {
			return nil, fmt.Errorf("field %s: %v", name, err)
		}
		m.fields[name] = s
		m.order = append(m.order, name)
	}
	return m, nil
}

// encodeDotL encodes a parsed message; fields not given are zero.
func encodeDotL(m *dotlMsg) ([]byte, error) {
	b := newFrame(m.typ, m.tag)
	for _, f := range dotlSpecs[m.typ].fields {
		val, ok := m.fields[f.name]
		if !ok {
			val = zeroValue(f.kind)
		}
		var err error
		if b, err = encodeField(b, f.kind, val); err != nil {
			return nil, fmt.Errorf("%s: %v", f.name, err)
		}
	}
	return finish(b), nil
}

func zeroValue(k fieldKind) string {
	switch k {
	case kStr, kData:
		return "''"
	case kStrs, kQids, kEnts:
		return "[]"
	case kQid:
		return "0x0.0"
	}
	return "0"
}

func encodeField(b []byte, k fieldKind, val string) ([]byte, error) {
	le := binary.LittleEndian
	switch k {
	case kU8:
		n, err := parseNum(val, 8)
		return append(b, uint8(n)), err
	case kU16:
		n, err := parseNum(val, 16)
		return le.AppendUint16(b, uint16(n)), err
	case kU32, kFid, kMode:
		n, err := parseNum(val, 32)
		return le.AppendUint32(b, uint32(n)), err
	case kU64:
		n, err := parseNum(val, 64)
		return le.AppendUint64(b, n), err
	case kErrno:
		for n, name := range errnoNames {
			if name == val {
				return le.AppendUint32(b, n), nil
			}
		}
		n, err := parseNum(val, 32)
		return le.AppendUint32(b, uint32(n)), err
	case kOflags:
		table := map[string]uint64{"O_RDONLY": 0}
		for _, f := range oflagNames {
			table[f.name] = uint64(f.bit)
		}
		n, err := parseFlags(val, nil, table)
		return le.AppendUint32(b, uint32(n)), err
	case kSetMsk:
		n, err := parseFlags(val, setMaskNames, nil)
		return le.AppendUint32(b, uint32(n)), err
	case kGetMsk:
		n, err := parseFlags(val, getMaskNames, map[string]uint64{"BASIC": getMaskBasic, "ALL": 0x3fff})
		return le.AppendUint64(b, n), err
	case kStr:
		s, err := unquote(val)
		return putString(b, s), err
	case kStrs:
		items := listItems(val)
		b = le.AppendUint16(b, uint16(len(items)))
		for _, it := range items {
			s, err := unquote(it)
			if err != nil {
				return nil, err
			}
			b = putString(b, s)
		}
		return b, nil
	case kQid:
		return appendQid(b, val)
	case kQids:
		items := listItems(val)
		b = le.AppendUint16(b, uint16(len(items)))
		for _, it := range items {
			var err error
			if b, err = appendQid(b, it); err != nil {
				return nil, err
			}
		}
		return b, nil
	case kData:
		s, err := unquote(val)
		if n, ok := strings.CutPrefix(val, "@"); ok {
			// @N is N bytes of 'x', for writes too long to spell out.
			k, e := strconv.Atoi(n)
			s, err = strings.Repeat("x", k), e
		}
		b = le.AppendUint32(b, uint32(len(s)))
		return append(b, s...), err
	case kEnts:
		var ents []byte
		for _, it := range listItems(val) {
			name, rest, ok := strings.Cut(it, "=")
			q, off, ok2 := strings.Cut(rest, "@")
			if !ok || !ok2 {
				return nil, fmt.Errorf("dirent %q: want name=qid@offset", it)
			}
			var err error
			if ents, err = appendQid(ents, q); err != nil {
				return nil, err
			}
			o, err := strconv.ParseUint(off, 0, 64)
			if err != nil {
				return nil, err
			}
			ents = le.AppendUint64(ents, o)
			ents = append(ents, ents[len(ents)-21]) // type: the QID's
			ents = putString(ents, name)
		}
		b = le.AppendUint32(b, uint32(len(ents)))
		return append(b, ents...), nil
	}
	return nil, fmt.Errorf("unknown kind %d", k)
}

func appendQid(b []byte, s string) ([]byte, error) {
	q, err := parseQidText(s)
	if err != nil {
		return nil, err
	}
	b = append(b, q.Type)
	b = binary.LittleEndian.AppendUint32(b, q.Vers)
	return binary.LittleEndian.AppendUint64(b, q.Path), nil
}

// parseQidText parses path.version[.d], as 9fans.net/go/plan9 writes QIDs.
func parseQidText(s string) (plan9.Qid, error) {
	f, err := plan9.ParseFcall("Rattach qid " + s)
	if err != nil {
		return plan9.Qid{}, err
	}
	return f.Qid, nil
}

// decodeField decodes one field; norm, if set, renames QID paths.
func decodeField(b []byte, k fieldKind, norm func(uint64) uint64) (string, []byte, error) {
	le := binary.LittleEndian
	need := func(n int) error {
		if len(b) < n {
			return errors.New("short message")
		}
		return nil
	}
	qid := func() (string, error) {
		if err := need(13); err != nil {
			return "", err
		}
		q := plan9.Qid{Type: b[0], Vers: le.Uint32(b[1:]), Path: le.Uint64(b[5:])}
		if norm != nil {
			q.Path = norm(q.Path)
		}
		b = b[13:]
		return q.String(), nil
	}
	str := func() (string, error) {
		if err := need(2); err != nil {
			return "", err
		}
		n := int(le.Uint16(b))
		if err := need(2 + n); err != nil {
			return "", err
		}
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return strconv.Quote(s), nil
	}
	switch k {
	case kU8:
		if err := need(1); err != nil {
			return "", nil, err
		}
		return strconv.FormatUint(uint64(b[0]), 10), b[1:], nil
	case kU16:
		if err := need(2); err != nil {
			return "", nil, err
		}
		return strconv.FormatUint(uint64(le.Uint16(b)), 10), b[2:], nil
	case kU32, kFid:
		if err := need(4); err != nil {
			return "", nil, err
		}
		n := le.Uint32(b)
		if k == kFid && n == 0xFFFFFFFF {
			return "NOFID", b[4:], nil
		}
		return strconv.FormatUint(uint64(n), 10), b[4:], nil
	case kMode:
		if err := need(4); err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("%#o", le.Uint32(b)), b[4:], nil
	case kU64:
		if err := need(8); err != nil {
			return "", nil, err
		}
		return strconv.FormatUint(le.Uint64(b), 10), b[8:], nil
	case kErrno:
		if err := need(4); err != nil {
			return "", nil, err
		}
		n := le.Uint32(b)
		if name, ok := errnoNames[n]; ok {
			return name, b[4:], nil
		}
		return strconv.FormatUint(uint64(n), 10), b[4:], nil
	case kOflags, kSetMsk:
		if err := need(4); err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("%#x", le.Uint32(b)), b[4:], nil
	case kGetMsk:
		if err := need(8); err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("%#x", le.Uint64(b)), b[8:], nil
	case kStr:
		s, err := str()
		return s, b, err
	case kStrs:
		if err := need(2); err != nil {
			return "", nil, err
		}
		n := int(le.Uint16(b))
		b = b[2:]
		var items []string
		for range n {
			s, err := str()
			if err != nil {
				return "", nil, err
			}
			items = append(items, s)
		}
		return "[" + strings.Join(items, " ") + "]", b, nil
	case kQid:
		s, err := qid()
		return s, b, err
	case kQids:
		if err := need(2); err != nil {
			return "", nil, err
		}
		n := int(le.Uint16(b))
		b = b[2:]
		var items []string
		for range n {
			s, err := qid()
			if err != nil {
				return "", nil, err
			}
			items = append(items, s)
		}
		return "[" + strings.Join(items, " ") + "]", b, nil
	case kData:
		if err := need(4); err != nil {
			return "", nil, err
		}
		n := int(le.Uint32(b))
		if err := need(4 + n); err != nil {
			return "", nil, err
		}
		return strconv.Quote(string(b[4 : 4+n])), b[4+n:], nil
	case kEnts:
		if err := need(4); err != nil {
			return "", nil, err
		}
		n := int(le.Uint32(b))
		if err := need(4 + n); err != nil {
			return "", nil, err
		}
		ents, rest := b[4:4+n], b[4+n:]
		var items []string
		for len(ents) > 0 {
			b = ents
			q, err := qid()
			if err != nil {
				return "", nil, err
			}
			if err := need(9); err != nil {
				return "", nil, err
			}
			off := le.Uint64(b)
			b = b[9:]
			name, err := str()
			if err != nil {
				return "", nil, err
			}
			name, _ = strconv.Unquote(name)
			items = append(items, fmt.Sprintf("%s=%s@%d", name, q, off))
			ents = b
		}
		return "[" + strings.Join(items, " ") + "]", rest, nil
	}
	return "", nil, fmt.Errorf("unknown kind %d", k)
}

// decodeDotL decodes a whole frame.
func decodeDotL(frame []byte, norm func(uint64) uint64) (*dotlMsg, error) {
	if len(frame) < headerSize {
		return nil, errors.New("short frame")
	}
	m := &dotlMsg{typ: frame[4], tag: binary.LittleEndian.Uint16(frame[5:]), fields: map[string]string{}}
	spec, ok := dotlSpecs[m.typ]
	if !ok {
		return nil, fmt.Errorf("unknown message type %d", m.typ)
	}
	b := frame[headerSize:]
	for _, f := range spec.fields {
		s, rest, err := decodeField(b, f.kind, norm)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %v", spec.name, f.name, err)
		}
		m.fields[f.name] = s
		m.order = append(m.order, f.name)
		b = rest
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%s: %d bytes left over", spec.name, len(b))
	}
	return m, nil
}
