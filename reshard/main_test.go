package reshard

import (
	"testing"

	"go.uber.org/goleak"
)

// A Mover runs each move on its own goroutine and ends aborted plans on
// another: none may outlive Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
