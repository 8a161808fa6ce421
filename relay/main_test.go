package relay

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the relay starts ends with Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
