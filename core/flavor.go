package core

import "fmt"

// Flavor is the gateway dialect a node speaks.
type Flavor uint8

// The two supported gateways.
const (
	Discord Flavor = iota // Discord API v10
	Fluxer                // Fluxer v1
)

func (f Flavor) String() string {
	if f == Fluxer {
		return "fluxer"
	}
	return "discord"
}

// ParseFlavor reads "discord" or "fluxer".
func ParseFlavor(s string) (Flavor, error) {
	switch s {
	case "discord":
		return Discord, nil
	case "fluxer":
		return Fluxer, nil
	}
	return 0, fmt.Errorf("%w: unknown flavor %q; usage: discord | fluxer", ErrUsage, s)
}
