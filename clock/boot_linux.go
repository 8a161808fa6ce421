package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

func boot() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Only a kernel older than 2.6.39 lacks it.
		return time.Since(monoOrigin)
	}
	return time.Duration(ts.Nano())
}
