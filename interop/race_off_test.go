//go:build !race

package interop

// raceEnabled reports whether the test binary has the race detector.
const raceEnabled = false
