package baremetal

import (
	"runtime/debug"
	"time"
)

// clockFloor is the earliest time the node believes: the commit time of
// the build when the binary records it, else the date this code was
// written. A clock behind it is certainly wrong (a dead RTC battery
// starts at 1970 or 2000).
func clockFloor() time.Time {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.time" {
				if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
					return t
				}
			}
		}
	}
	return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
}
