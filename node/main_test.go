package node

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a node starts ends when Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
