package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sfclient "github.com/shardfs/shardfs/client"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/sessions"
)

// serveProc is one running `serve` of a restart test.
type serveProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	root   *sfclient.Client
}

// startNode runs `serve --sessions sessDir` for flavor against sim and
// waits, at most 30 s, for its TCP listener. Fluxer's run discovers with
// --total 2, so that its endpoint comes from discovery before the start.
func startNode(t *testing.T, bin string, sim *gatewaysim.Server, token, sessDir string, args ...string) *serveProc {
	t.Helper()
	base := []string{"serve", "--api", sim.APIURL(), "--listen", "tcp!127.0.0.1!0", "--sessions", sessDir, "--backoff", "fixed:100ms"}
	if sim.Flavor() == gatewaysim.Fluxer {
		base = append(base, "--flavor", "fluxer", "--total", strconv.Itoa(sim.Config().Shards))
	} else {
		base = append(base, "--flavor", "discord", "--total", "auto", "--max-concurrency", strconv.Itoa(sim.Config().MaxConcurrency))
	}
	return startProc(t, bin, token, syscall.SIGKILL, append(base, args...)...)
}

// startProc runs the binary in bin with args and SHARDFS_TOKEN=token, and
// waits, at most 30 s, for the tree of its TCP listener. At cleanup a
// process still running gets sig and is waited for; a failed test logs
// its stderr.
func startProc(t *testing.T, bin, token string, sig syscall.Signal, args ...string) *serveProc {
	t.Helper()
	cmd := command(t, bin, args...)
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN="+token)
	n := &serveProc{cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = n.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(sig)
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s's stderr:\n%s", args[0], n.stderr)
		}
	})
	n.root = dotlRoot(t, tcpHostPort(tcpListener(t, n.stderr)))
	return n
}

func (n *serveProc) waitReady(t *testing.T, shards int) {
	t.Helper()
	eventually(t, "every shard READY", func() (bool, string) {
		s, err := dotlRead(n.root, "status")
		return err == nil && strings.Count(s, " READY ") == shards, s
	})
}

// stop signals the process and checks that it exits 0.
func (n *serveProc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	n.cmd.Process.Signal(sig)
	err := n.cmd.Wait()
	if sig == syscall.SIGKILL {
		return
	}
	if err != nil {
		t.Fatalf("serve exited with %v after %v:\n%s", err, sig, n.stderr)
	}
}

// dispatched reads /dispatch and counts every message id in it.
type dispatchLine struct {
	Shard int             `json:"shard"`
	S     *int64          `json:"s"`
	T     string          `json:"t"`
	D     json.RawMessage `json:"d"`
}

func readDispatch(t *testing.T, root *sfclient.Client, path string) []dispatchLine {
	t.Helper()
	text, err := dotlRead(root, path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var out []dispatchLine
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		var d dispatchLine
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("%s: a line that is not JSON: %q: %v", path, line, err)
		}
		out = append(out, d)
	}
	return out
}

func messageIDs(lines []dispatchLine) map[string]int {
	ids := map[string]int{}
	for _, l := range lines {
		if l.T != "MESSAGE_CREATE" {
			continue
		}
		var m struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(l.D, &m) == nil && m.ID != "" {
			ids[m.ID]++
		}
	}
	return ids
}

// publish sends count messages to every shard, ids PREFIX-SHARD-I.
func publish(t *testing.T, sim *gatewaysim.Server, shards, count int, prefix string) []string {
	t.Helper()
	var ids []string
	for sh := range shards {
		for i := range count {
			id := fmt.Sprintf("%s-%d-%d", prefix, sh, i)
			ev := gatewaysim.Event{Name: "MESSAGE_CREATE", Data: json.RawMessage(`{"id":"` + id + `","content":"x"}`)}
			if n, err := sim.Publish(sh, ev); err != nil || n != 1 {
				t.Fatalf("publish %s reached %d sessions (%v); want 1", id, n, err)
			}
			ids = append(ids, id)
		}
	}
	return ids
}

// waitIDs waits until /dispatch holds every id of want.
func waitIDs(t *testing.T, root *sfclient.Client, want []string) map[string]int {
	t.Helper()
	var got map[string]int
	eventually(t, fmt.Sprintf("%d messages in /dispatch", len(want)), func() (bool, string) {
		got = messageIDs(readDispatch(t, root, "dispatch"))
		for _, id := range want {
			if got[id] == 0 {
				return false, "missing " + id
			}
		}
		return true, ""
	})
	return got
}

func waitNoLiveSessions(t *testing.T, sim *gatewaysim.Server) {
	t.Helper()
	eventually(t, "the simulator sees every connection gone", func() (bool, string) {
		tot := sim.Totals()
		return tot.LiveSessions == 0, fmt.Sprint(tot.LiveSessions)
	})
}

// loadSnapshot decodes a shard's snapshot file.
func loadSnapshotFile(t *testing.T, dir string, shard int) (core.Snapshot, os.FileInfo) {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("shard-%d.json", shard))
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("no snapshot of shard %d: %v", shard, err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := sessions.Decode(b)
	if err != nil {
		t.Fatalf("shard %d's snapshot does not decode: %v", shard, err)
	}
	return snap, fi
}

// The whole restart story through the real binary, both flavors, against
// the simulator: a clean stop (SIGTERM for Discord, SIGINT for Fluxer)
// saves every session, messages published while serve is down arrive
// once in the next process's /dispatch with the sequence continuing and no
// new identify; a second serve on the same folder is refused and names the
// first's PID; `stop all` saves too; a SIGKILL after a resume leaves
// nothing resumable: the next process identifies every shard and resumes
// none twice.
func TestServeRestartResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs serve four times")
	}
	bin := binDir(t)
	for _, tc := range []struct {
		flavor gatewaysim.Flavor
		sig    syscall.Signal
	}{
		{gatewaysim.Discord, syscall.SIGTERM},
		{gatewaysim.Fluxer, syscall.SIGINT},
	} {
		t.Run(tc.flavor.String(), func(t *testing.T) {
			const shards = 2
			token := "RESTART-TOKEN-" + tc.flavor.String() + "-do-not-print"
			sim, err := gatewaysim.New(gatewaysim.Config{Flavor: tc.flavor, Token: token, Shards: shards, MaxConcurrency: shards, IdentifyInterval: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			sessDir := filepath.Join(t.TempDir(), "sessions")

			// Run 1: a new session per shard, traffic, a clean stop.
			n1 := startNode(t, bin, sim, token, sessDir)
			n1.waitReady(t, shards)
			before := publish(t, sim, shards, 10, "before")
			waitIDs(t, n1.root, before)
			seqs := make([]int64, shards)
			for sh := range shards {
				s, _ := dotlRead(n1.root, fmt.Sprintf("%d/sequence", sh))
				if seqs[sh], err = strconv.ParseInt(strings.TrimSpace(s), 10, 64); err != nil {
					t.Fatalf("shard %d's sequence %q", sh, s)
				}
			}
			n1.stop(t, tc.sig)
			if fi, err := os.Stat(sessDir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("the sessions folder: %v, %v; want mode 0700", fi.Mode(), err)
			}
			for sh := range shards {
				snap, fi := loadSnapshotFile(t, sessDir, sh)
				if fi.Mode().Perm() != 0o600 || snap.Used() || snap.Sequence != seqs[sh] {
					t.Errorf("shard %d's snapshot after %v: mode %v, used %v, sequence %d; want 0600, resumable, %d", sh, tc.sig, fi.Mode().Perm(), snap.Used(), snap.Sequence, seqs[sh])
				}
				if strings.Contains(n1.stderr.String(), snap.Session.ID) {
					t.Errorf("shard %d's session id is in serve's log", sh)
				}
			}

			// While down: the simulator keeps sequencing into the sessions.
			down := publish(t, sim, shards, 10, "down")

			// Run 2: every shard resumes; a second serve on the folder is
			// refused.
			n2 := startNode(t, bin, sim, token, sessDir)
			n2.waitReady(t, shards)
			other := command(t, bin, "serve", "--flavor", "discord", "--gateway", sim.GatewayURL(), "--total", "1", "--listen", "tcp!127.0.0.1!0", "--sessions", sessDir)
			other.Env = append(other.Env, "SHARDFS_TOKEN="+token)
			out, err := other.CombinedOutput()
			if want := fmt.Sprintf("in use by process %d", n2.cmd.Process.Pid); err == nil || !strings.Contains(string(out), want) {
				t.Errorf("a second serve on the folder: %v, %q; want a refusal saying %q", err, out, want)
			}
			got := waitIDs(t, n2.root, down)
			for _, id := range down {
				if got[id] != 1 {
					t.Errorf("%s arrived %d times in the second process's /dispatch; want 1", id, got[id])
				}
			}
			for _, id := range before {
				if got[id] != 0 {
					t.Errorf("%s, delivered before the stop, arrived again after the restart", id)
				}
			}
			tot := sim.Totals()
			if tot.Identifies != shards || tot.Resumes != shards {
				t.Errorf("after the restart the simulator counted %d identifies and %d resumes; want %d and %d", tot.Identifies, tot.Resumes, shards, shards)
			}
			for sh := range shards {
				// The sequence continues where the stop left it.
				var first *int64
				for _, l := range readDispatch(t, n2.root, fmt.Sprintf("%d/dispatch", sh)) {
					if l.S != nil {
						first = l.S
						break
					}
				}
				if first == nil || *first != seqs[sh]+1 {
					t.Errorf("shard %d's first dispatch after the restart has sequence %v; want %d", sh, first, seqs[sh]+1)
				}
				diag, _ := dotlRead(n2.root, fmt.Sprintf("%d/diag", sh))
				if !strings.Contains(diag, "session_restored yes\n") || !strings.Contains(diag, "session_epoch 0\n") {
					t.Errorf("shard %d's diag after the restart:\n%s", sh, diag)
				}
				if snap, _ := loadSnapshotFile(t, sessDir, sh); !snap.Used() {
					t.Errorf("shard %d resumed a snapshot still resumable in the folder", sh)
				}
			}
			after := publish(t, sim, shards, 5, "after")
			got = waitIDs(t, n2.root, after)
			for _, id := range after {
				if got[id] != 1 {
					t.Errorf("%s arrived %d times; want 1", id, got[id])
				}
			}

			// `stop all` saves: a crash after it loses nothing.
			if err := write(n2.root, "ctl", []byte("stop all\n")); err != nil {
				t.Fatal(err)
			}
			for sh := range shards {
				if snap, _ := loadSnapshotFile(t, sessDir, sh); snap.Used() {
					t.Errorf("shard %d: `stop all` returned before its snapshot was saved", sh)
				}
			}
			n2.stop(t, syscall.SIGKILL)
			n3 := startNode(t, bin, sim, token, sessDir)
			n3.waitReady(t, shards)
			if tot := sim.Totals(); tot.Identifies != shards || tot.Resumes != 2*shards {
				t.Errorf("after stop all and a crash the simulator counted %d identifies and %d resumes; want %d and %d", tot.Identifies, tot.Resumes, shards, 2*shards)
			}

			// A crash of a process that resumed: nothing is resumable.
			n3.stop(t, syscall.SIGKILL)
			waitNoLiveSessions(t, sim)
			n4 := startNode(t, bin, sim, token, sessDir)
			n4.waitReady(t, shards)
			tot = sim.Totals()
			if tot.Identifies != 2*shards || tot.Resumes != 2*shards || tot.MaxLiveSessions != 1 {
				t.Errorf("after a crash: %d identifies, %d resumes, at most %d live sessions a shard; want %d, %d, 1", tot.Identifies, tot.Resumes, tot.MaxLiveSessions, 2*shards, 2*shards)
			}
			for sh := range shards {
				if ev, _ := dotlRead(n4.root, fmt.Sprintf("%d/events", sh)); !strings.Contains(ev, "event=snapshot-ignored") || !strings.Contains(ev, "reason=used") {
					t.Errorf("shard %d's events after the crash do not say why it identified:\n%s", sh, ev)
				}
			}
			n4.stop(t, syscall.SIGTERM)
			for _, n := range []*serveProc{n1, n2, n3, n4} {
				if strings.Contains(n.stderr.String(), token) {
					t.Errorf("the token appeared on serve's stderr")
				}
			}
		})
	}
}

// Bad snapshot files through the real binary: a truncated one, one that is
// not JSON and a symlink (pointing at a good copy elsewhere, which must not
// be followed) each make their shard start a new session with one clear
// line in its events; the intact shard resumes.
func TestServeRestartBadSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("runs serve twice")
	}
	const shards = 4
	const token = "BADSNAP-TOKEN-do-not-print"
	bin := binDir(t)
	sim, err := gatewaysim.New(gatewaysim.Config{Flavor: gatewaysim.Discord, Token: token, Shards: shards, MaxConcurrency: shards, IdentifyInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sessDir := filepath.Join(t.TempDir(), "sessions")
	n1 := startNode(t, bin, sim, token, sessDir)
	n1.waitReady(t, shards)
	// An impatient second signal does not cut the saves short.
	n1.cmd.Process.Signal(syscall.SIGTERM)
	n1.stop(t, syscall.SIGTERM)
	for sh := range shards {
		if snap, _ := loadSnapshotFile(t, sessDir, sh); snap.Used() {
			t.Fatalf("shard %d saved nothing resumable after two SIGTERMs", sh)
		}
	}

	file := func(sh int) string { return filepath.Join(sessDir, fmt.Sprintf("shard-%d.json", sh)) }
	b0, err := os.ReadFile(file(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file(0), b0[:len(b0)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file(1), []byte("not json at all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "shard-2.json")
	if err := os.Rename(file(2), elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, file(2)); err != nil {
		t.Fatal(err)
	}
	kept, err := os.ReadFile(elsewhere)
	if err != nil {
		t.Fatal(err)
	}

	n2 := startNode(t, bin, sim, token, sessDir)
	n2.waitReady(t, shards)
	for sh, want := range []string{"shard-0.json", "shard-1.json", "is a symlink"} {
		st := sim.Stats(sh)
		if st.Identifies != 2 || st.Resumes != 0 {
			t.Errorf("shard %d: %d identifies, %d resumes; want 2, 0", sh, st.Identifies, st.Resumes)
		}
		ev, _ := dotlRead(n2.root, fmt.Sprintf("%d/events", sh))
		if n := strings.Count(ev, "event=snapshot-"); n != 1 || !strings.Contains(ev, "event=snapshot-error") || !strings.Contains(ev, want) || !strings.Contains(ev, "then=\"new session\"") {
			t.Errorf("shard %d's events: %d snapshot lines; want one snapshot-error naming %q:\n%s", sh, n, want, ev)
		}
	}
	if st := sim.Stats(3); st.Identifies != 1 || st.Resumes != 1 {
		t.Errorf("shard 3 (intact snapshot): %d identifies, %d resumes; want 1, 1", st.Identifies, st.Resumes)
	}
	if now, err := os.ReadFile(elsewhere); err != nil || string(now) != string(kept) {
		t.Errorf("the symlink's target changed: %q, %v", now, err)
	}
	n2.stop(t, syscall.SIGTERM)

	// --resume-window reaches the core: snapshots older than it are not
	// tried.
	n3 := startNode(t, bin, sim, token, sessDir, "--resume-window", "1ms")
	n3.waitReady(t, shards)
	for sh := range shards {
		if st := sim.Stats(sh); st.Identifies != 3 && sh < 3 || st.Identifies != 2 && sh == 3 {
			t.Errorf("shard %d with --resume-window 1ms: %d identifies; want a new one", sh, st.Identifies)
		}
		if ev, _ := dotlRead(n3.root, fmt.Sprintf("%d/events", sh)); !strings.Contains(ev, "event=snapshot-ignored") || !strings.Contains(ev, "older than the resume window") {
			t.Errorf("shard %d's events with --resume-window 1ms:\n%s", sh, ev)
		}
	}
	n3.stop(t, syscall.SIGTERM)
}

// The session flags refuse what cannot work, before anything connects: a
// negative window, and a --sessions path that is not a folder.
func TestServeSessionFlags(t *testing.T) {
	tmp := t.TempDir()
	tokenFile := filepath.Join(tmp, "token")
	notDir := filepath.Join(tmp, "file")
	for _, f := range []string{tokenFile, notDir} {
		if err := os.WriteFile(f, []byte("FLAGS-TOKEN-1234\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--resume-window", "-5s"}, "--resume-window -5s"},
		{[]string{"--sessions", notDir}, "--sessions: cannot create sessions folder " + notDir + ": " + notDir + " is not a directory"},
	} {
		args := append([]string{"serve", "--flavor", "discord", "--gateway", "ws://127.0.0.1:1/", "--total", "1",
			"--token-file", tokenFile, "--listen", "tcp!127.0.0.1!0"}, tc.args...)
		var out, errb strings.Builder
		err := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if err == nil || !strings.Contains(err.Error()+errb.String(), tc.want) {
			t.Errorf("shardfs %v = %v (stderr %q); want an error containing %q", args, err, errb.String(), tc.want)
		}
	}
}

// Fluxer with --sessions and --total N discovers before the start, for the
// endpoint its snapshots are checked against. A discovery that fails there
// does not stop serve (a store problem never stops a shard): it says so
// once at Error, the shards keep trying as they would without --sessions,
// and a signal still stops it cleanly.
func TestServeFluxerSessionsDiscoveryFails(t *testing.T) {
	tmp := t.TempDir()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := "http://" + dead.Addr().String() + "/api/v1"
	dead.Close() // nothing answers there now
	cmd := command(t, binDir(t), "serve", "--flavor", "fluxer", "--api", api, "--total", "2", "--listen", "tcp!127.0.0.1!0", "--sessions", filepath.Join(tmp, "s"))
	cmd.Env = append(cmd.Env, "SHARDFS_TOKEN=FLUXER-NODISC-TOKEN")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	eventually(t, "serve listening after the failed discovery", func() (bool, string) {
		s := stderr.String()
		return strings.Contains(s, "level=ERROR msg=\"discovery before the start failed") && strings.Contains(s, "addr=tcp!"), s
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM:\n%s", err, stderr)
	}
}
