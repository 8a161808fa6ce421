// Package systemd_test checks the example systemd unit with systemd's own
// parser.
package systemd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
)

const installed = "/usr/local/bin/shardfs"

// TestUnitVerifies runs systemd-analyze verify on shardfs.service, with
// ExecStart pointed at an executable the test makes (verify refuses a
// unit whose binary is missing). systemd-analyze exits 0 on a line it
// ignores ("Failed to parse ..., ignoring"), so any output fails too.
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is missing (Debian: apt-get install systemd)")
		}
		t.Skip("systemd-analyze not installed (Debian: apt-get install systemd): the unit is not verified")
	}
	unit, err := os.ReadFile("shardfs.service")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(unit, []byte("ExecStart="+installed+" serve")) {
		t.Fatalf("shardfs.service: no ExecStart=%s serve", installed)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "shardfs")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "shardfs.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte(installed), []byte(bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify shardfs.service: %v\n%s", err, out)
	}
}

// TestStopTimeout: TimeoutStopSec covers a clean stop of serve (the
// unit's comment adds it up: 5 s of saves and 12 s of close handshakes)
// with room to spare, since systemd's SIGKILL past it makes every shard
// identify again.
func TestStopTimeout(t *testing.T) {
	unit, err := os.ReadFile("shardfs.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindSubmatch(unit)
	if m == nil {
		t.Fatal("shardfs.service sets no TimeoutStopSec")
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(m[1])))
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: %v", m[1], err)
	}
	// The gateway client's writeTimeout and closeGrace, unexported.
	const closeHandshake = 10*time.Second + 2*time.Second
	cleanStop := core.StoreTimeout + closeHandshake
	if d < 2*cleanStop {
		t.Errorf("TimeoutStopSec = %v; want at least twice the longest clean stop, %v", d, 2*cleanStop)
	}
}
