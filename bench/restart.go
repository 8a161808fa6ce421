package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/internal/poll"
)

// restartConfig sizes the restart comparison. The zero value is the smoke
// test's: 4 shards, one run.
type restartConfig struct {
	shards      []int // each a comparison of its own
	runs        []int // runs of each size
	concurrency int   // max_concurrency the simulator enforces
}

func (c restartConfig) withDefaults() restartConfig {
	if len(c.shards) == 0 {
		c.shards, c.runs = []int{4}, []int{1}
	}
	if c.concurrency <= 0 {
		c.concurrency = 16
	}
	return c
}

func defaultRestartConfig() restartConfig {
	// The cold start of 1,024 shards at max_concurrency 16 is 64 windows
	// of 5 s: one run of that size.
	return restartConfig{shards: []int{64, 1024}, runs: []int{3, 1}, concurrency: 16}
}

// The columns of the restart comparison.
const (
	colCold   = "cold start (identify)"
	colResume = "restart (resume)"
)

// buildServe builds cmd/shardfs into dir.
func buildServe(dir string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/shardfs/shardfs").Output()
	if err != nil {
		return "", fmt.Errorf("finding the shardfs module: %w", err)
	}
	bin := filepath.Join(dir, "shardfs")
	build := exec.Command("go", "build", "-o", bin, "./cmd/shardfs")
	build.Dir = strings.TrimSpace(string(out))
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/shardfs: %v\n%s", err, b)
	}
	return bin, nil
}

// buildServeTemp builds cmd/shardfs into a new temporary folder; done
// removes the folder.
func buildServeTemp() (bin string, done func(), err error) {
	dir, err := os.MkdirTemp("", "shardfs-bench-serve-")
	if err != nil {
		return "", nil, err
	}
	if bin, err = buildServe(dir); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// tempWithToken makes a temporary folder holding the bench token in the
// file "token" (mode 0600); done removes the folder.
func tempWithToken(prefix string) (dir, tokenFile string, done func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", nil, err
	}
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(benchToken), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	return dir, tokenFile, func() { os.RemoveAll(dir) }, nil
}

// serveProc is one `shardfs serve --sessions DIR` against the simulator.
type serveProc struct {
	cmd    *exec.Cmd
	stderr *tailBuffer
	done   chan error
}

func startServe(bin string, s *sim, sessDir, tokenFile, sock string) (*serveProc, error) {
	cmd := exec.Command(bin, "serve", "--flavor", "discord", "--api", s.api, "--total", "auto",
		"--listen", "unix!"+sock, "--sessions", sessDir, "--token-file", tokenFile)
	cmd.Env = os.Environ()
	p := &serveProc{cmd: cmd, stderr: &tailBuffer{max: 16 << 10}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if verbose {
		cmd.Stderr = io.MultiWriter(p.stderr, prefixWriter{role: "serve", w: os.Stderr})
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// stop sends SIGTERM and returns how long serve took to exit (closing every
// connection with 4000 and saving every snapshot).
func (p *serveProc) stop() (time.Duration, error) {
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			return 0, fmt.Errorf("serve exited with %v after SIGTERM: %s", err, p.stderr)
		}
		return time.Since(start), nil
	case <-time.After(2 * time.Minute):
		p.cmd.Process.Kill()
		<-p.done
		return 0, fmt.Errorf("serve did not exit within 2 min of SIGTERM: %s", p.stderr)
	}
}

func (p *serveProc) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		<-p.done
	}
}

// waitReady polls serve's /status over 9P, at most for d, until every one
// of n shards is READY.
func waitReady(sock string, n int, d time.Duration) error {
	return poll.Until(context.Background(), "serve's shards all READY", d, 50*time.Millisecond, func() error {
		text, err := readStatus(sock)
		if err != nil {
			return err
		}
		if got := bytes.Count(text, []byte(" READY ")); got != n {
			return fmt.Errorf("%d of %d READY", got, n)
		}
		return nil
	})
}

func readStatus(sock string) ([]byte, error) { return readTree(sock, "status") }

// untilLive times serve's start to the moment the simulator sees every one
// of n shards with a live session.
func untilLive(s *sim, n int, timeout time.Duration, start func() (*serveProc, error)) (*serveProc, time.Duration, error) {
	began := time.Now()
	p, err := start()
	if err != nil {
		return nil, 0, err
	}
	v, err := s.callInts(timeout+time.Minute, "wait-live %d %v", n, timeout)
	if err != nil {
		p.kill()
		return nil, 0, fmt.Errorf("%w (serve: %s)", err, p.stderr)
	}
	return p, time.Unix(0, v[0]).Sub(began), nil
}

type restartResult struct {
	cold, resume         time.Duration // serve's start to every shard live
	coldStop, resumeStop time.Duration // SIGTERM to exit
	coldIDs, resumeIDs   int64         // identifies the simulator answered
	resumes              int64         // resumes the simulator answered on the restart
}

// restartRun starts n shards cold with --sessions, stops serve cleanly,
// starts it again on the same folder, and times both starts.
func restartRun(bin string, n, mc int) (restartResult, error) {
	var r restartResult
	tmp, tokenFile, done, err := tempWithToken("shardfs-bench-restart-")
	if err != nil {
		return r, err
	}
	defer done()
	sessDir := filepath.Join(tmp, "sessions")
	s, err := startSim(n, "-max-concurrency", strconv.Itoa(mc), "-identify-interval", "5s")
	if err != nil {
		return r, err
	}
	defer s.close()
	rounds := (n + mc - 1) / mc
	timeout := time.Duration(rounds)*5*time.Second + 2*time.Minute
	sock := filepath.Join(tmp, "tree.sock")
	start := func() (*serveProc, error) { return startServe(bin, s, sessDir, tokenFile, sock) }

	p, cold, err := untilLive(s, n, timeout, start)
	if err != nil {
		return r, fmt.Errorf("cold start: %w", err)
	}
	r.cold = cold
	// The simulator sees a session live when it sends READY; serve has
	// a session to save only once it read it.
	if err := waitReady(sock, n, time.Minute); err != nil {
		p.kill()
		return r, fmt.Errorf("cold start: %w", err)
	}
	t, err := s.totals()
	if err != nil {
		p.kill()
		return r, err
	}
	r.coldIDs = t.Identifies
	if r.coldStop, err = p.stop(); err != nil {
		return r, err
	}
	files, _ := filepath.Glob(filepath.Join(sessDir, "shard-*.json"))
	if len(files) != n {
		return r, fmt.Errorf("the clean stop left %d snapshots of %d shards", len(files), n)
	}
	// serve has exited: every connection is closed. Wait for the
	// simulator to see it, so that wait-live sees only the restart's.
	err = poll.Until(context.Background(), "the simulator seeing no live session after serve exited", time.Minute, 10*time.Millisecond, func() error {
		t, err := s.totals()
		if err != nil {
			return poll.Stop(err)
		}
		if t.LiveSessions != 0 {
			return fmt.Errorf("%d live sessions", t.LiveSessions)
		}
		return nil
	})
	if err != nil {
		return r, err
	}

	p, resume, err := untilLive(s, n, timeout, start)
	if err != nil {
		return r, fmt.Errorf("restart: %w", err)
	}
	r.resume = resume
	t2, err := s.totals()
	if err != nil {
		p.kill()
		return r, err
	}
	r.resumeIDs, r.resumes = t2.Identifies-t.Identifies, t2.Resumes-t.Resumes
	if r.resumeStop, err = p.stop(); err != nil {
		return r, err
	}
	return r, nil
}

func runRestart(cfg config, log io.Writer) (*section, error) {
	rc := cfg.restart.withDefaults()
	sec := &section{columns: []string{colCold, colResume}}
	bin, done, err := buildServeTemp()
	if err != nil {
		return sec, err
	}
	defer done()
	var notes []string
	for i, n := range rc.shards {
		runs := 1
		if i < len(rc.runs) {
			runs = rc.runs[i]
		}
		times := map[string][]float64{}
		stops := map[string][]float64{}
		ids := map[string][]float64{}
		allResumed := true
		for run := range runs {
			r, err := restartRun(bin, n, rc.concurrency)
			if err != nil {
				return sec, fmt.Errorf("%d shards: %w", n, err)
			}
			times[colCold] = append(times[colCold], r.cold.Seconds())
			times[colResume] = append(times[colResume], r.resume.Seconds())
			stops[colCold] = append(stops[colCold], r.coldStop.Seconds())
			stops[colResume] = append(stops[colResume], r.resumeStop.Seconds())
			ids[colCold] = append(ids[colCold], float64(r.coldIDs))
			ids[colResume] = append(ids[colResume], float64(r.resumeIDs))
			allResumed = allResumed && r.resumeIDs == 0 && r.resumes == int64(n)
			fmt.Fprintf(log, "bench: restart %d shards, run %d: cold start %v (%d identifies), restart %v (%d resumes, %d identifies); clean stops %v and %v\n",
				n, run+1, r.cold.Round(time.Millisecond), r.coldIDs, r.resume.Round(time.Millisecond), r.resumes, r.resumeIDs,
				r.coldStop.Round(time.Millisecond), r.resumeStop.Round(time.Millisecond))
		}
		rounds := (n + rc.concurrency - 1) / rc.concurrency
		sec.add(row{
			measure: fmt.Sprintf("serve's start until %d shards READY, max_concurrency %d", n, rc.concurrency), unit: "s",
			values: times, digits: 2,
			ratio:  fmt.Sprintf("resume in %.1f%% of the cold start's time", 100*median(times[colResume])/median(times[colCold])),
			target: "restart within one identify window (5 s), whatever the shard count",
			met:    boolp(median(times[colResume]) < 5),
		})
		sec.add(row{
			measure: fmt.Sprintf("identifies the simulator answered, %d shards", n), values: ids,
			ratio: fmt.Sprintf("%.0f on the restart", median(ids[colResume])), target: "none on the restart, every shard resumed",
			met: boolp(allResumed),
		})
		sec.add(row{
			measure: fmt.Sprintf("SIGTERM until serve exited, %d snapshots saved", n), unit: "s",
			values: stops, digits: 3,
		})
		notes = append(notes, fmt.Sprintf("%d shards: %d run(s); a cold start is ceil(%d / %d) = %d identify windows, the last beginning %v after the first.",
			n, runs, n, rc.concurrency, rounds, time.Duration(rounds-1)*5*time.Second))
	}
	sec.method = []string{
		"Each run starts a fresh simulator (Discord flavour, the real identify rule: one identify per bucket, shard % max_concurrency, per 5 s; " +
			fmt.Sprintf("max_concurrency %d, session_start_limit large enough) and the real binary, `shardfs serve --flavor discord --total auto --sessions DIR`, built from this tree. ", rc.concurrency) +
			"The cold start has an empty DIR, so every shard identifies. Then SIGTERM: serve closes every connection with 4000 and saves one snapshot per shard (temp file, fsync, rename, fsync of the folder) before it exits; " +
			"the run checks that DIR holds one snapshot per shard. Then serve starts again on the same DIR at once, well inside the 120 s resume window, and every shard resumes its session. " +
			"Both times run from the exec of serve (discovery, the folder's lock, the loads included) to the moment the simulator sees every shard's session live; the simulator's counters say how many identifies and resumes it answered. " +
			"The identify window is not scaled down: shardfs's own pacer keeps Discord's 5 s per bucket whatever the simulator allows, so scaling only the simulator would not shorten the cold start.",
		strings.Join(notes, " "),
	}
	return sec, nil
}
