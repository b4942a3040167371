package relay

import (
	"net/netip"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// Global Relays (docs/design.md §2.3) and the cluster relays behind them.
//
// A Global Relay is this relay with Config.Ingress set. It reads the first
// packet's token like any relay, but routes by the token's cluster id: its
// membership table maps cluster ids to cluster relays' public addresses.
// It forwards each client datagram there with a hop header naming the
// client, from its internal socket, and sends what comes back (hop-framed,
// naming the client) to the client from its public socket, exactly as a
// cluster relay does with transceivers.
//
// A cluster relay accepts such hop-framed datagrams on its public socket
// from Config.TrustedIngress prefixes only (the first byte, hop.Magic, is
// outside every RFC 7983 range, so it cannot be mistaken for client
// traffic). It treats the inner datagram as if it came from the client
// named in the header: the same token check on the first packet, the same
// flow keyed by the client's address, with the Global Relay remembered as
// the flow's via. Replies from the transceiver for that client go back to
// the via, unchanged (the transceiver's header already names the client),
// from the public socket the Global Relay sent to.

// ingressTrusted reports whether from may send hop-framed datagrams to the
// public socket.
func (r *Relay) ingressTrusted(from netip.AddrPort) bool {
	return r.cfg.trustedIngress.Contains(from.Addr())
}

// handleFromIngress handles hop-framed datagram pkt from Global Relay from on
// the public socket. The header is rewritten in place (same length, it is
// canonical once parsed), so out is pkt itself.
func (r *Relay) handleFromIngress(from netip.AddrPort, pkt []byte, now time.Time) (to netip.AddrPort, out []byte, drop DropReason) {
	if !r.ingressTrusted(from) {
		return to, nil, DropIngressUntrusted
	}
	typ, client, payload, err := hop.ParseHeader(pkt)
	if err != nil || len(payload) == 0 {
		return to, nil, DropIngressBadHeader
	}
	// A TCP client of the Global Relay (DATA_TCP) is a TCP client here
	// too: its own flow, and replies of the same type.
	return r.fromClient(hop.ClientOf(typ, client), from, pkt, len(pkt)-len(payload), now)
}
