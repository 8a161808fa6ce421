package baremetal

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

// Settings are the node's settings from the kernel command line: the
// shardfs.* keys of DESIGN 7.6.
type Settings struct {
	Flavor  core.Flavor
	Total   string   // a count, or "auto"
	Shards  string   // e.g. "0-3,7"; empty: all of the total
	Listen  []string // 9P listeners, in the order given
	Etcd    []string // etcd endpoints
	Bot     string
	Node    string // the node's name in etcd; Boot defaults it (NodeName)
	API     string
	Gateway string
	// Enroll is the enrollment server's host:port (package enroll).
	Enroll string

	// The TLS listener's files, which Boot sets once the enrollment
	// server sent them (never from the command line).
	TLSCert, TLSKey, TLSClientCA string
	// etcd's TLS files, which Boot sets when the enrollment server sent
	// them.
	EtcdCA, EtcdCert, EtcdKey string
	// Enrollment, which Boot sets once the node enrolled, is what its
	// /enroll shows.
	Enrollment *Enrollment
}

// DefaultListen is the listener of a node whose command line names none
// and whose enrollment brought the TLS files.
const DefaultListen = "tls!0.0.0.0!5641"

// Args are serve's flags for s (the token is not among them).
func (s Settings) Args() []string {
	args := []string{"--flavor", s.Flavor.String(), "--total", s.Total}
	if s.Shards != "" {
		args = append(args, "--shards", s.Shards)
	}
	for _, l := range s.Listen {
		args = append(args, "--listen", l)
	}
	if s.API != "" {
		args = append(args, "--api", s.API)
	}
	if s.Gateway != "" {
		args = append(args, "--gateway", s.Gateway)
	}
	if s.TLSCert != "" {
		args = append(args, "--tls-cert", s.TLSCert, "--tls-key", s.TLSKey, "--tls-client-ca", s.TLSClientCA)
	}
	if len(s.Etcd) > 0 {
		args = append(args, "--etcd", strings.Join(s.Etcd, ","), "--bot", s.Bot)
		if s.Node != "" {
			args = append(args, "--node", s.Node)
		}
		if s.EtcdCA != "" {
			args = append(args, "--etcd-ca", s.EtcdCA)
		}
		if s.EtcdCert != "" {
			args = append(args, "--etcd-cert", s.EtcdCert, "--etcd-key", s.EtcdKey)
		}
	}
	return args
}

// Problem is one thing wrong with the command line. A Fatal problem
// refuses the boot: running with a guess there could start shards another
// node owns, or export the tree where the operator did not ask. The others
// are ignored and the node boots with its defaults.
type Problem struct {
	Key   string // the key as written, e.g. "shardfs.totl"
	Err   error
	Fatal bool
}

func (p Problem) String() string {
	verdict := "ignored"
	if p.Fatal {
		verdict = "refusing to start the node"
	}
	return fmt.Sprintf("%s: %v (%s)", p.Key, p.Err, verdict)
}

// Errors of the command line, wrapped by each Problem's Err.
var (
	ErrUnknownKey = errors.New("unknown key")
	ErrMalformed  = errors.New("malformed value")
	ErrMissing    = errors.New("missing")
	ErrCode       = errors.New("a one-time code never goes on the kernel command line: the boot script is world-readable and travels in the clear, and whoever reads the code first spends it for this node; give it at the node's console, or approve the node's fingerprint (doc/baremetal.md)")
	ErrSecret     = errors.New("the token never goes on the kernel command line: /proc/cmdline is world-readable and the boot script travels in the clear; the node receives it from the enrollment server (shardfs.enroll, shardfs netboot --serve)")
)

// Keys are the shardfs.* keys the command line may carry.
var Keys = []string{"flavor", "total", "shards", "listen", "etcd", "bot", "node", "api", "gateway", "enroll"}

// ParseCmdline reads the shardfs.* keys of a kernel command line (the
// content of /proc/cmdline) and ignores every other word. Values may be
// double-quoted, as the kernel allows. shardfs.listen may repeat; any
// other key given twice with different values is a fatal problem. The
// problems come in the order of the line, then the missing keys.
func ParseCmdline(line string) (Settings, []Problem) {
	var s Settings
	var probs []Problem
	seen := map[string]string{}
	bad := func(key string, fatal bool, err error) {
		probs = append(probs, Problem{Key: key, Err: err, Fatal: fatal})
	}
	for _, word := range splitCmdline(line) {
		k, v, hasValue := strings.Cut(word, "=")
		if k == "SHARDFS_TOKEN" {
			// The kernel hands KEY=VALUE words without a dot to init's
			// environment: the same leak as shardfs.token.
			bad(k, true, ErrSecret)
			continue
		}
		name, ok := strings.CutPrefix(k, "shardfs.")
		if !ok {
			continue
		}
		if name == "token" {
			bad(k, true, ErrSecret) // the value is never echoed
			continue
		}
		if name == "code" {
			bad(k, true, ErrCode) // attack report 21b, finding 10: it was "ignored" but served
			continue
		}
		if !known(name) {
			bad(k, false, fmt.Errorf("%w (known: shardfs.%s)", ErrUnknownKey, strings.Join(Keys, ", shardfs.")))
			continue
		}
		if !hasValue || v == "" {
			bad(k, true, fmt.Errorf("%w: no value", ErrMalformed))
			continue
		}
		if name != "listen" {
			if prev, dup := seen[name]; dup && prev != v {
				bad(k, true, fmt.Errorf("%w: given twice, %q and %q", ErrMalformed, prev, v))
				continue
			}
			seen[name] = v
		}
		if err := s.set(name, v); err != nil {
			bad(k, true, fmt.Errorf("%w: %q: %w", ErrMalformed, v, err))
		}
	}
	for _, req := range []string{"flavor", "total"} {
		if _, ok := seen[req]; !ok {
			bad("shardfs."+req, true, fmt.Errorf("%w: %s", ErrMissing, requiredWhy[req]))
		}
	}
	if len(s.Etcd) > 0 {
		if s.Bot == "" {
			bad("shardfs.bot", true, fmt.Errorf("%w: shardfs.etcd needs the bot's name, the folder of its keys in etcd", ErrMissing))
		}
	} else {
		for _, k := range []struct{ key, v string }{{"shardfs.bot", s.Bot}, {"shardfs.node", s.Node}} {
			if k.v != "" {
				bad(k.key, false, errors.New("only meaningful with shardfs.etcd"))
			}
		}
	}
	if s.Total != "" && s.Total != "auto" && s.Shards != "" {
		n, _ := strconv.Atoi(s.Total)
		ids, _ := core.ParseShardList(s.Shards)
		if err := (core.Plan{Total: n, Local: ids}).Validate(); err != nil {
			bad("shardfs.shards", true, fmt.Errorf("%w: %v", ErrMalformed, err))
		}
	}
	return s, probs
}

var requiredWhy = map[string]string{
	"flavor": "the gateway flavor (discord or fluxer) cannot be guessed",
	"total":  "the shard count (or auto) cannot be guessed",
}

func known(name string) bool {
	for _, k := range Keys {
		if k == name {
			return true
		}
	}
	return false
}

func (s *Settings) set(name, v string) error {
	switch name {
	case "flavor":
		f, err := core.ParseFlavor(v)
		if err != nil {
			return errors.New("want discord or fluxer")
		}
		s.Flavor = f
	case "total":
		if v != "auto" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > core.MaxTotal {
				return fmt.Errorf("want a count from 1 to %d, or auto", core.MaxTotal)
			}
		}
		s.Total = v
	case "shards":
		if _, err := core.ParseShardList(v); err != nil {
			return err
		}
		s.Shards = v
	case "listen":
		la, err := fsrv.ParseListenAddr(v)
		if err != nil {
			return err
		}
		if la.Network == "tcp" && !la.TLS && !la.Insecure && !loopback(la.Address) {
			// serve would refuse it on the node, and Boot would retry
			// it forever: refused here, with the key named.
			return fmt.Errorf("%w: 9P is not encrypted and the tree takes commands; use tls!HOST!PORT, or add ,insecure to serve plain TCP anyway", fsrv.ErrInsecure)
		}
		s.Listen = append(s.Listen, v)
	case "etcd":
		for _, e := range strings.Split(v, ",") {
			if err := checkURL(e, "http", "https"); err != nil {
				return err
			}
			s.Etcd = append(s.Etcd, e)
		}
	case "bot", "node":
		for _, r := range v {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
				return fmt.Errorf("%s names use letters, digits, '-', '_' and '.', not %q", name, r)
			}
		}
		if name == "bot" {
			s.Bot = v
		} else {
			s.Node = v
		}
	case "api":
		if err := checkURL(v, "http", "https"); err != nil {
			return err
		}
		s.API = v
	case "gateway":
		if err := checkURL(v, "ws", "wss"); err != nil {
			return err
		}
		s.Gateway = v
	case "enroll":
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			return err
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return errors.New("want HOST:PORT, the address of shardfs netboot --serve")
		}
		s.Enroll = v
	}
	return nil
}

// loopback tells whether a listener's host:port is loopback on the node:
// a loopback IP or localhost. Any other name is refused, since whatever
// it resolves to on the machine running netboot says nothing about the
// node.
func loopback(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func checkURL(v string, schemes ...string) error {
	u, err := url.Parse(v)
	if err != nil {
		return err
	}
	for _, s := range schemes {
		if u.Scheme == s && u.Host != "" {
			return nil
		}
	}
	return fmt.Errorf("want a %s URL with a host", strings.Join(schemes, " or "))
}

// splitCmdline splits a kernel command line into words as the kernel does:
// at spaces outside double quotes, which are removed.
func splitCmdline(line string) []string {
	var words []string
	var b strings.Builder
	quoted, inWord := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, b.String())
	}
	return words
}
