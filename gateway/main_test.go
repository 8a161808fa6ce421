package gateway

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childSimEnv) != "" {
		// The benchmarks' simulator runs in a process of its own, so that
		// their CPU and memory figures are the client's alone.
		os.Exit(runChildSim())
	}
	goleak.VerifyTestMain(m)
}
