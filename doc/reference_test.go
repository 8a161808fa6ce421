// Package doc_test checks the manual against the code: the tree's
// reference (shardfs.4.md) against the trees the programs build, and every
// page's links.
package doc_test

import (
	"bufio"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/lease/etcd/etcdtest"
	"github.com/shardfs/shardfs/node"
	"github.com/shardfs/shardfs/supervisor"
)

// A tree as the reference describes it, or as a program builds it.
type tree struct {
	files     map[string]string // path (shard directories as /N) -> mode word
	private   map[string]bool   // not on a read-only listener
	content   map[string][]byte // what a text file holds now
	nodeCmds  []string          // usage lines of /ctl
	shardCmds []string          // usage lines of /N/ctl
}

// The trees of the reference's marks: unmarked entries are in every tree.
var kinds = map[string][]string{
	"node":      {"node"},
	"fleet":     {"node", "fleet"},
	"supervise": {"supervise"},
	"relay":     {"node", "relay"},
}

// TestReference: the reference names every file, directory and ctl
// command of the three trees (a node's, a fleet node's and supervise's
// parent's), each in the trees it says, with its mode, and names nothing
// they do not have.
func TestReference(t *testing.T) {
	ref := parseReference(t, "shardfs.4.md")
	built := map[string]tree{
		"node":      walk(t, nodeRoot(t, nil)),
		"fleet":     walk(t, nodeRoot(t, fleetEtcd(t))),
		"supervise": walk(t, superviseRoot(t)),
		"relay":     walk(t, relayRoot(t)),
	}
	for _, kind := range []string{"node", "fleet", "supervise", "relay"} {
		got, want := built[kind], ref.tree(kinds[kind])
		for _, p := range sortedKeys(got.files) {
			switch mode, ok := want.files[p]; {
			case !ok:
				t.Errorf("%s tree: %s is not in shardfs.4.md (or not marked for this tree)", kind, p)
			case mode != got.files[p]:
				t.Errorf("shardfs.4.md: %s is %q; the %s tree has it %q", p, mode, kind, got.files[p])
			case want.private[p] != got.private[p]:
				t.Errorf("shardfs.4.md: %s says 'not on a read-only listener' = %v; the %s tree: %v", p, want.private[p], kind, got.private[p])
			}
		}
		for _, p := range sortedKeys(want.files) {
			if _, ok := got.files[p]; !ok {
				t.Errorf("shardfs.4.md names %s for the %s tree, which has no such file", p, kind)
			}
		}
		for _, p := range sortedKeys(got.content) {
			if !strings.Contains(ref.entry[p], "key-value") {
				continue
			}
			for line := range strings.Lines(string(got.content[p])) {
				key, _, _ := strings.Cut(line, " ")
				if !mentions(ref.entry[p], key) {
					t.Errorf("the %s tree's %s shows key %q, which its entry in shardfs.4.md does not name", kind, p, key)
				}
			}
		}
		diff(t, kind+" tree's /ctl", got.nodeCmds, want.nodeCmds)
		diff(t, kind+" tree's /N/ctl", got.shardCmds, want.shardCmds)
	}
}

// TestReferenceSections: the reference reads as a section-4 manual page
// does, its sections in the usual order.
func TestReferenceSections(t *testing.T) {
	b, err := os.ReadFile("shardfs.4.md")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			got = append(got, h)
		}
	}
	want := []string{"NAME", "SYNOPSIS", "DESCRIPTION", "EXAMPLES", "FILES", "SEE ALSO", "BUGS"}
	if !slices.Equal(got, want) {
		t.Errorf("shardfs.4.md sections = %q; want %q", got, want)
	}
}

// mentions says whether an entry names key in a code span: `key`, or
// `key ...` (a line such as `child ID STATE`).
func mentions(entry, key string) bool {
	for _, m := range codeSpan.FindAllStringSubmatch(entry, -1) {
		if m[1] == key || strings.HasPrefix(m[1], key+" ") {
			return true
		}
	}
	return false
}

func diff(t *testing.T, what string, got, want []string) {
	t.Helper()
	for _, c := range got {
		if !slices.Contains(want, c) {
			t.Errorf("%s accepts %q, which shardfs.4.md does not list", what, c)
		}
	}
	for _, c := range want {
		if !slices.Contains(got, c) {
			t.Errorf("shardfs.4.md lists %q for %s, which does not accept it", c, what)
		}
	}
}

// nodeRoot builds a node (serve's, demo's, a supervised child's) without
// starting it: the tree is complete before anything connects.
func nodeRoot(t *testing.T, e *node.Etcd) *fsrv.Dir {
	n, err := node.New(node.Config{
		Flavor: core.Discord, Token: "unused", GatewayURL: "ws://127.0.0.1:1/",
		Plan: core.Range(4, 0, 3), Etcd: e,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.Server.Root
}

// relayRoot builds the tree of a node with the gateway relay (serve
// --relay).
func relayRoot(t *testing.T) *fsrv.Dir {
	n, err := node.New(node.Config{
		Flavor: core.Discord, Token: "unused", GatewayURL: "ws://127.0.0.1:1/",
		Plan: core.Range(4, 0, 3), Relay: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.Server.Root
}

// fleetEtcd is a fleet node's part: a real etcd, since the fleet's pacer
// watches it from the start.
func fleetEtcd(t *testing.T) *node.Etcd {
	srv := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &node.Etcd{Client: cli, Bot: "doc", Node: "n1"}
}

// superviseRoot builds supervise's parent tree over two children that
// are never launched.
func superviseRoot(t *testing.T) *fsrv.Dir {
	a, err := supervisor.ByProcesses(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	sup := supervisor.New(supervisor.Config{Assignment: a, Policy: supervisor.DefaultPolicy,
		Launch: func(supervisor.Launch, *supervisor.Reports) (supervisor.Process, error) {
			return nil, errors.New("not launched")
		}})
	t.Cleanup(sup.Close)
	tr := supervisor.NewTree(supervisor.TreeConfig{Supervisor: sup, Assignment: a, Flavor: core.Discord,
		Identify: func() core.Budget { return core.Budget{} }})
	t.Cleanup(tr.Close)
	return tr.Root()
}

// walk lists a tree: every file under its path, shard directories as /N
// (shard 0's stands for all), and the usage of its ctl files.
func walk(t *testing.T, root *fsrv.Dir) tree {
	out := tree{files: map[string]string{}, private: map[string]bool{}, content: map[string][]byte{}}
	var visit func(dir string, d *fsrv.Dir)
	visit = func(dir string, d *fsrv.Dir) {
		for _, f := range d.List() {
			name := fsrv.FileName(f)
			if _, err := parseShard(name); err == nil {
				if name != "0" {
					continue
				}
				name = "N"
			}
			p := dir + "/" + name
			out.files[p], out.private[p] = mode(f)
			switch f := f.(type) {
			case *fsrv.Dir:
				visit(p, f)
			case *fsrv.Text:
				out.content[p] = f.Content()
			case *fsrv.Ctl:
				if f.Usage == nil {
					break
				}
				lines := strings.Split(strings.TrimSuffix(f.Usage(), "\n"), "\n")
				if p == "/ctl" {
					out.nodeCmds = lines
				} else {
					out.shardCmds = lines
				}
			}
		}
	}
	visit("", root)
	if _, ok := out.files["/N"]; !ok {
		t.Fatal("the tree lists no shard 0")
	}
	return out
}

func parseShard(name string) (int, error) {
	var n int
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0, errors.New("not a shard")
		}
		n = n*10 + int(c-'0')
	}
	if name == "" {
		return 0, errors.New("empty")
	}
	return n, nil
}

// mode is the reference's word for f's mode, and whether f is private.
func mode(f fsrv.File) (string, bool) {
	switch f := f.(type) {
	case *fsrv.Dir:
		return "directory", f.Private
	case *fsrv.Text:
		return "read", f.Private
	case *fsrv.LogFile:
		return "read", f.Private
	case *fsrv.Ctl:
		if f.Usage == nil {
			return "write", f.Private
		}
		return "read-write", f.Private
	}
	return "unknown", false
}

// reference is what shardfs.4.md lists, by mark ("" for every tree).
type reference struct {
	files     map[string]map[string]string // mark -> path -> mode
	private   map[string]bool
	entry     map[string]string   // path -> the entry's text
	nodeCmds  map[string][]string // mark -> usage lines
	shardCmds []string
}

func (r reference) tree(marks []string) tree {
	out := tree{files: map[string]string{}, private: r.private}
	for _, m := range append([]string{""}, marks...) {
		for p, mode := range r.files[m] {
			out.files[p] = mode
		}
		out.nodeCmds = append(out.nodeCmds, r.nodeCmds[m]...)
	}
	out.shardCmds = r.shardCmds
	return out
}

var (
	// - `/lease`, read (node): ...
	fileEntry = regexp.MustCompile("^- `(/[^`]*)`, (read|write|read-write|directory)(?: \\((node|fleet|supervise|relay|enrollment server|PXE node)\\))?[,:]")
	// - `reset all|ID...`, `stop all|ID...`: ...   - `drain` (fleet): ...
	cmdEntry = regexp.MustCompile("^- ((?:`[^`]+`,\\s*)*`[^`]+`)(?: \\((node|fleet|supervise|relay)\\))?:")
	codeSpan = regexp.MustCompile("`([^`]+)`")
)

// parseReference reads the entries of the DESCRIPTION section: list items
// that start with a file's path or, under "Shard commands" and "Node
// commands", with the usage of one or more commands. An entry's first
// line may wrap; the mark and the colon end it.
func parseReference(t *testing.T, name string) reference {
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ref := reference{files: map[string]map[string]string{}, private: map[string]bool{}, entry: map[string]string{}, nodeCmds: map[string][]string{}}
	var section, sub string
	var item []string // the lines of the list item being read
	flush := func() {
		if len(item) == 0 {
			return
		}
		text := strings.Join(item, " ")
		item = nil
		switch {
		case sub == "Shard commands" || sub == "Node commands":
			m := cmdEntry.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("shardfs.4.md, %s: an entry that does not start with a command's usage: %.60q", sub, text)
				return
			}
			for _, c := range codeSpan.FindAllStringSubmatch(m[1], -1) {
				if sub == "Shard commands" {
					if m[2] != "" {
						t.Errorf("shardfs.4.md: shard command %q is marked (%s): every tree has the same shard directories", c[1], m[2])
					}
					ref.shardCmds = append(ref.shardCmds, c[1])
				} else {
					ref.nodeCmds[m[2]] = append(ref.nodeCmds[m[2]], c[1])
				}
			}
		case strings.HasPrefix(text, "- `/"):
			m := fileEntry.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("shardfs.4.md: a file entry that does not read \"- `PATH`, MODE (MARK):\": %.60q", text)
				return
			}
			if ref.files[m[3]] == nil {
				ref.files[m[3]] = map[string]string{}
			}
			if _, dup := ref.files[m[3]][m[1]]; dup {
				t.Errorf("shardfs.4.md lists %s twice", m[1])
			}
			ref.files[m[3]][m[1]] = m[2]
			ref.private[m[1]] = strings.Contains(text, "not on a read-only listener")
			ref.entry[m[1]] += text
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			flush()
			section, sub = strings.TrimPrefix(line, "## "), ""
			continue
		case strings.HasPrefix(line, "### "):
			flush()
			sub = strings.TrimPrefix(line, "### ")
			continue
		}
		if section != "DESCRIPTION" {
			continue
		}
		switch {
		case strings.HasPrefix(line, "- "):
			flush()
			item = []string{line}
		case len(item) > 0 && strings.HasPrefix(line, "  "):
			item = append(item, strings.TrimSpace(line))
		default:
			flush()
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ref.files[""]) == 0 || len(ref.shardCmds) == 0 || len(ref.nodeCmds[""]) == 0 {
		t.Fatalf("shardfs.4.md: no entries found (files %v, shard commands %v, node commands %v)", ref.files, ref.shardCmds, ref.nodeCmds)
	}
	return ref
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
