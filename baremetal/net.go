package baremetal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

// NICPattern selects the interfaces DHCP runs on: the kernel's names
// without udev (eth0) and the predictable ones (enp1s0).
const NICPattern = "^(eth|en)"

// loUp brings up the loopback interface; the kernel gives it 127.0.0.1.
func loUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	return nil
}

// ErrNoLease says that no interface got a DHCP answer.
var ErrNoLease = errors.New("no DHCP answer on any interface")

// dhcp runs one round of DHCPv4 on every NIC at once and configures the
// first interface that gets a lease: address, route(s) and
// /etc/resolv.conf.
func dhcp(ctx context.Context, timeout time.Duration) (dhclient.Lease, error) {
	ifs, err := dhclient.Interfaces(NICPattern)
	if err != nil {
		return nil, fmt.Errorf("%w (did the NIC's module load?)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	results := dhclient.SendRequests(ctx, ifs, true, false, dhclient.Config{
		Timeout: timeout / 3, Retries: 2, V4ClientIdentifier: true,
	}, timeout)
	var errs []error
	var got dhclient.Lease
	for r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Interface.Attrs().Name, r.Err))
			continue
		}
		if got != nil {
			continue // drain: SendRequests closes the channel when all are done
		}
		if err := r.Lease.Configure(); err != nil {
			errs = append(errs, fmt.Errorf("%s: configuring %v: %w", r.Interface.Attrs().Name, r.Lease, err))
			continue
		}
		got = r.Lease
		cancel() // the other interfaces stop asking
	}
	if got != nil {
		return got, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrNoLease, errors.Join(errs...))
}

// leaseHostname is the host name (option 12) a DHCPv4 lease gave, if any.
func leaseHostname(l dhclient.Lease) string {
	if m, _ := l.Message(); m != nil {
		return m.HostName()
	}
	return ""
}

// leaseMAC is the hardware address of the lease's interface.
func leaseMAC(l dhclient.Lease) net.HardwareAddr {
	if link := l.Link(); link != nil {
		return link.Attrs().HardwareAddr
	}
	return nil
}

// leaseIP is the address the lease gave, or "".
func leaseIP(l dhclient.Lease) string {
	if m, _ := l.Message(); m != nil && m.YourIPAddr != nil && !m.YourIPAddr.IsUnspecified() {
		return m.YourIPAddr.String()
	}
	return ""
}
