//go:build !linux

package clock

import "time"

func boot() time.Duration { return time.Since(monoOrigin) }
