package main

import (
	"bytes"
	"strings"
	"testing"
)

// A small reshard comparison through the real binary: 4 shards move to 8,
// the copies sent to both plans are recognised, and the section has its
// rows, each target met.
func TestReshard(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs serve")
	}
	var log bytes.Buffer
	sec, err := runReshard(config{}, &log)
	if err != nil {
		t.Fatalf("runReshard: %v\n%s", err, log.String())
	}
	sec.number, sec.title = 10, "Reshard"
	report := render(config{command: "go test"}, "", []*section{sec})
	for _, want := range []string{"4011 to the switch, 4 -> 8 shards, max_concurrency 4", "events sent to both plans during the move, 4 -> 8", "identifies for the move, 4 -> 8",
		"events in flight at the switch (held by the cut, released at once), 4 -> 8", "identifies refused (op 9) during the move, 4 -> 8", "baseline, same traffic and time without a move"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "not met") {
		t.Errorf("a target is not met:\n%s\n%s", report, log.String())
	}
}
