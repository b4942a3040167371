package demo

import (
	"fmt"
	"net/netip"

	"github.com/switchboard-rtc/switchboard/internal/relay"
)

// FailOverRelay stands in, for tests, for the demo's relay dying behind
// its VIP while another relay keeps serving it: it starts a second relay
// like the first on new ports of the same addresses (an empty flow table;
// it registers no metrics), calls redirect with it (where the test sends
// the VIP's new connections to it), then makes it the demo's relay and
// closes the first. If redirect fails, the second relay is closed and the
// first keeps serving. Not safe to call concurrently with Relay.
func (d *Demo) FailOverRelay(redirect func(next *relay.Relay) error) error {
	old := d.relay
	cfg := d.rcfg
	cfg.PublicAddr = netip.AddrPortFrom(old.PublicAddr().Addr(), 0).String()
	cfg.TCPAddr = netip.AddrPortFrom(old.TCPAddr().Addr(), 0).String()
	r, err := relay.New(cfg, d.keys, d.members, nil, d.log)
	if err != nil {
		return fmt.Errorf("demo: start the second relay: %w", err)
	}
	if err := redirect(r); err != nil {
		_ = r.Close()
		return err
	}
	d.relay = r
	_ = old.Close()
	return nil
}
