package clock

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Mono of the real clock is CLOCK_BOOTTIME, which counts a suspend: it
// is never behind CLOCK_MONOTONIC (equal on a machine never suspended),
// whereas Go's own monotonic reading is CLOCK_MONOTONIC.
func TestRealMonoCountsSuspend(t *testing.T) {
	var mono, boot unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		t.Fatal(err)
	}
	got := Mono(Real{})
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot); err != nil {
		t.Fatal(err)
	}
	if int64(got) < mono.Nano() || int64(got) > boot.Nano() {
		t.Fatalf("Mono(Real{}) = %v; want between CLOCK_MONOTONIC %dns and the CLOCK_BOOTTIME read after it %dns", got, mono.Nano(), boot.Nano())
	}
}
