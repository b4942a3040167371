package transceiver

import (
	"net/netip"
)

// ICE-TCP (RFC 6544): a client whose network drops UDP reaches the relay
// over TCP, and the relay carries its packets over the same internal hop,
// typed DATA_TCP (docs/hop.md). hop.Conn reports such a client under its
// TCP form of address (hop.TCPAddr), so internal/peer keys its path apart
// from any UDP path and answers on the transport each check came in on;
// path selection moves media between them as between any two addresses
// (internal/peer, session.go "Path selection"). What the transceiver adds
// is the answer's passive TCP candidate and the metrics by transport.

// tcpIngress returns the ICE-TCP address to advertise beside UDP ingress
// in: Config.AdvertiseTCP for the relay VIP, the same port at a region's
// ingress IP; invalid without AdvertiseTCP.
func (c *Config) tcpIngress(in netip.AddrPort) netip.AddrPort {
	if !c.advertiseTCP.IsValid() {
		return netip.AddrPort{}
	}
	if in == c.advertise {
		return c.advertiseTCP
	}
	return netip.AddrPortFrom(in.Addr().Unmap(), c.advertiseTCP.Port())
}
