package main

import (
	"bytes"
	"strings"
	"testing"
)

// A small restart comparison through the real binary: the restart answers
// no identify and one resume per shard, both starts are timed, and the
// section has its rows.
func TestRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs serve")
	}
	bin, err := buildServe(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r, err := restartRun(bin, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	if r.coldIDs != 4 || r.resumeIDs != 0 || r.resumes != 4 {
		t.Errorf("cold start %d identifies, restart %d identifies and %d resumes; want 4, 0, 4", r.coldIDs, r.resumeIDs, r.resumes)
	}
	if r.cold <= 0 || r.resume <= 0 || r.coldStop <= 0 || r.resumeStop <= 0 {
		t.Errorf("times not measured: %+v", r)
	}
	var log bytes.Buffer
	sec, err := runRestart(config{}, &log)
	if err != nil {
		t.Fatalf("runRestart: %v\n%s", err, log.String())
	}
	sec.number, sec.title = 7, "Restarts"
	report := render(config{command: "go test"}, "", []*section{sec})
	for _, want := range []string{"serve's start until 4 shards READY, max_concurrency 16", "identifies the simulator answered, 4 shards", "| 4 (1 run) | 0 (1 run) |", "**met**", "SIGTERM until serve exited, 4 snapshots saved"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}
