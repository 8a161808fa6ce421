package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

// usageSections splits the usage text by command: a section starts at a
// line "  shardfs NAME" and takes the lines indented further.
func usageSections(t *testing.T) map[string]string {
	t.Helper()
	sections := map[string]string{}
	var cur string
	for line := range strings.Lines(usage) {
		if rest, ok := strings.CutPrefix(line, "  shardfs "); ok {
			cur = strings.Fields(rest)[0]
			if _, dup := sections[cur]; dup {
				t.Errorf("usage: two sections for %s", cur)
			}
			sections[cur] = rest
			continue
		}
		if cur != "" && strings.HasPrefix(line, "   ") {
			sections[cur] += line
		}
	}
	return sections
}

// usageFlag is a flag as usage writes it: --name, or -n for a one-letter
// one, after a space, a bracket, a parenthesis or a bar.
var usageFlag = regexp.MustCompile(`(?:^|[\s\[(|])--?([a-z][a-z0-9-]*)`)

func namedFlags(text string) map[string]bool {
	names := map[string]bool{}
	for _, m := range usageFlag.FindAllStringSubmatch(text, -1) {
		names[m[1]] = true
	}
	return names
}

// registered are the flags a command registers, read from what its flag
// set prints for -h.
func registered(t *testing.T, args ...string) map[string]bool {
	t.Helper()
	var out, errb strings.Builder
	err := run(context.Background(), append(args, "-h"), strings.NewReader(""), &out, &errb)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("shardfs %s -h = %v; want flag.ErrHelp", strings.Join(args, " "), err)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(errb.String()))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "  -"); ok {
			names[strings.Fields(rest)[0]] = true
		}
	}
	if len(names) == 0 {
		t.Fatalf("shardfs %s -h lists no flag:\n%s", strings.Join(args, " "), errb.String())
	}
	return names
}

// The usage text names every flag each command registers, and no flag a
// command does not have; it has a section for every command.
func TestUsageNamesEveryFlag(t *testing.T) {
	sections := usageSections(t)
	for name := range commands {
		if _, ok := sections[name]; !ok {
			t.Errorf("usage has no section for command %s", name)
		}
	}
	for name := range sections {
		if _, ok := commands[name]; !ok && name != "help" {
			t.Errorf("usage has a section for %s, which is no command", name)
		}
	}
	// ls, cat, write and tail share one flag set: tail's own flags are
	// on its line only.
	client := []string{"ls", "cat", "write", "tail"}
	var clientText string
	for _, c := range client {
		clientText += sections[c]
	}
	for name, text := range sections {
		var flags map[string]bool
		switch name {
		case "version", "help":
			if f := namedFlags(text); len(f) > 0 {
				t.Errorf("usage of %s names flags %v; it takes none", name, f)
			}
			continue
		case "certs":
			flags = map[string]bool{}
			for _, kind := range []string{"ca", "server", "client"} {
				for f := range registered(t, "certs", kind) {
					flags[f] = true
				}
			}
		default:
			flags = registered(t, name)
		}
		named := namedFlags(text)
		if slices.Contains(client, name) {
			named = namedFlags(clientText)
		}
		if name == "supervise" {
			// "(serve's flags, but for ...)": serve's lines name them.
			if !strings.Contains(text, "(serve's flags") {
				t.Errorf("usage of supervise does not refer to serve's flags:\n%s", text)
			}
			for f := range namedFlags(sections["serve"]) {
				named[f] = true
			}
		}
		for f := range flags {
			if !named[f] {
				t.Errorf("usage of %s does not name --%s, which it registers", name, f)
			}
		}
		if slices.Contains(client, name) {
			continue // each names a subset of the shared set
		}
		for f := range namedFlags(text) {
			if !flags[f] {
				t.Errorf("usage of %s names --%s, which it does not register", name, f)
			}
		}
	}
	for f := range namedFlags(clientText) {
		if !registered(t, "ls")[f] {
			t.Errorf("usage of ls, cat, write and tail names --%s, which they do not register", f)
		}
	}
}

// version names the module version, or devel with the revision, then the
// Go version and the platform.
func TestVersion(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"go install @v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/shardfs/shardfs", Version: "v1.2.3"}},
			"v1.2.3 go1.26.0 " + platform},
		{"a dirty checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-12-07T04:00:00Z"}}},
			"devel 0123456789ab+dirty 2026-12-07T04:00:00Z go1.26.0 " + platform},
		{"no VCS", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"devel go1.26.0 " + platform},
		{"no build information", nil, "unknown " + runtime.Version() + " " + platform},
	} {
		if got := version(tc.bi); got != tc.want {
			t.Errorf("%s: version = %q; want %q", tc.name, got, tc.want)
		}
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"version"}, strings.NewReader(""), &out, &out); err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(out.String()); len(f) < 4 || f[0] != "shardfs" || !strings.HasPrefix(f[len(f)-2], "go1.") || f[len(f)-1] != platform {
		t.Errorf("shardfs version = %q; want shardfs VERSION go1.N %s", out.String(), platform)
	}
}

// go install github.com/shardfs/shardfs/cmd/shardfs@latest refuses a
// module whose go.mod replaces or excludes a module.
func TestGoModInstallable(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "replace" || f[0] == "exclude") {
			t.Errorf("go.mod:%d: %q: go install ...@latest refuses a module with %s directives", i+1, line, f[0])
		}
	}
}
