package doc_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// outside are files that users of the repository do not have: the team's
// design notes and measured facts.
var outside = regexp.MustCompile(`\b(DESIGN|FACTS|STYLE)\.md\b|\.\./shared\b|/work/`)

var (
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A path in a code span or in the text that names a file of the
	// repository: one of its top-level folders, then more.
	repoPath = regexp.MustCompile("(?:^|[\\s`(])((?:[a-z][a-z0-9_.-]*/)+[A-Za-z0-9_.-]+\\.(?:md|go|sh|service|txt))\\b")
	fence    = regexp.MustCompile("^\\s*```")
	// A section named in the text: see "A fleet", (above, "The tree").
	quoted = regexp.MustCompile(`(?i)(?:\bsee|above,|below,) "([^"]+)"`)
)

// pages are README.md and every page of doc/, relative to the repository.
func pages(t *testing.T) []string {
	out := []string{"README.md"}
	m, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m {
		out = append(out, "doc/"+p)
	}
	return out
}

// TestLinks: every relative link of README.md and doc/*.md names a file
// of the repository and, with #anchor, a heading of it; every path of the
// repository a page names exists; no page mentions a file outside it.
func TestLinks(t *testing.T) {
	anchors := map[string]map[string]bool{} // page -> heading slugs
	for _, page := range pages(t) {
		b, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if m := outside.FindString(text); m != "" {
			t.Errorf("%s mentions %q, which users of the repository do not have", page, m)
		}
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			rel := page
			if file != "" {
				rel = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
			}
			if strings.HasPrefix(rel, "../") {
				t.Errorf("%s links to %s, outside the repository", page, target)
				continue
			}
			if _, err := os.Stat(filepath.Join("..", rel)); err != nil {
				t.Errorf("%s links to %s: %v", page, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(rel, ".md") {
				t.Errorf("%s links to %s: an anchor in a file that is not markdown", page, target)
				continue
			}
			if anchors[rel] == nil {
				anchors[rel] = headingSlugs(t, rel)
			}
			if !anchors[rel][anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", page, target, rel, anchor)
			}
		}
		for _, m := range quoted.FindAllStringSubmatch(text, -1) {
			t.Errorf("%s names the section %q in words: link to it (page.md#anchor), so that a test sees it move", page, m[1])
		}
		for _, m := range repoPath.FindAllStringSubmatch(text, -1) {
			p := m[1]
			top, _, _ := strings.Cut(p, "/")
			if fi, err := os.Stat(filepath.Join("..", top)); err != nil || !fi.IsDir() {
				continue // not a folder of the repository: a path on the user's machine
			}
			if _, err := os.Stat(filepath.Join("..", p)); err != nil {
				t.Errorf("%s names %s, which is not in the repository", page, p)
			}
		}
	}
}

// headingSlugs are the anchors GitHub makes of a page's headings: lower
// case, punctuation dropped but - and _, spaces as -, a repeated one
// suffixed -1, -2, ...
func headingSlugs(t *testing.T, page string) map[string]bool {
	b, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	return slugs(string(b))
}

func slugs(page string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				s.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				s.WriteRune(r)
			}
		}
		slug := s.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestSlugs: anchors as GitHub makes them.
func TestSlugs(t *testing.T) {
	page := "## A shard's directory\n## 9. Restarts: resume vs cold start (serve --sessions)\n```\n# not a heading\n```\n## Notes\n## Notes\n"
	got := slugs(page)
	for _, want := range []string{"a-shards-directory", "9-restarts-resume-vs-cold-start-serve---sessions", "notes", "notes-1"} {
		if !got[want] {
			t.Errorf("slugs(%q) = %v; want %q among them", page, got, want)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("slugs took a comment in a code block for a heading")
	}
}

// TestFrontDoor: the README's first code block is the two commands a fresh
// machine needs, the demo and the whole test suite, and the README stays
// a front door rather than the manual.
func TestFrontDoor(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var block []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if fence.MatchString(line) {
			if in {
				break
			}
			in = true
			continue
		}
		if in {
			cmd, _, _ := strings.Cut(line, "#")
			block = append(block, strings.TrimSpace(cmd))
		}
	}
	want := []string{"go run ./cmd/shardfs demo", "./test.sh"}
	if strings.Join(block, "\n") != strings.Join(want, "\n") {
		t.Errorf("README's first code block = %q; want %q", block, want)
	}
	if fi, err := os.Stat("../test.sh"); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("test.sh is not an executable file: %v", err)
	}
	if n := strings.Count(string(b), "\n"); n > 200 {
		t.Errorf("README.md has %d lines; the manual's pages are in doc/, the README is its front door (about 150)", n)
	}
}
