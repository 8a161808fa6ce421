package core_test

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Lifecycle interleavings need length to reach leases, expiry and the
	// start limit: rapid's default of 30 steps rarely gets there.
	if f := flag.Lookup("rapid.steps"); f != nil && f.Value.String() == f.DefValue {
		f.Value.Set("150")
	}
	goleak.VerifyTestMain(m)
}
