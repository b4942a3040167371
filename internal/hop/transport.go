package hop

import "net/netip"

// Client addresses by transport.
//
// A client is named by its transport and its address: a TCP client at
// 198.51.100.7:50000 and a UDP client at 198.51.100.7:50000 are two
// clients, with two flows at the relay and two paths at the transceiver.
// So that every table keyed by a client's netip.AddrPort keys by transport
// too, without a new type on every path that handles addresses (the
// relay's flow table, hop.Conn's routes, internal/peer's paths), a TCP
// client's address is carried in Go as its IPv6 form (an IPv4 address as
// IPv4-mapped IPv6) with the zone TCPZone, e.g. [::ffff:198.51.100.7%tcp]:50000.
// No UDP client's address ever has that form: addresses from UDP sockets
// are unmapped at the edge, and a zone names an interface, which clients'
// addresses never carry. The hop header carries the transport as its type
// (TypeDataTCP) and the address plain; TCPAddr and SplitTCP convert.

// TCPZone is the zone that marks a TCP client's address (TCPAddr).
const TCPZone = "tcp"

// TCPAddr returns the form naming the TCP client at a (see above). a must
// be a plain (unzoned) address; an address already in TCP form is
// returned as it is.
func TCPAddr(a netip.AddrPort) netip.AddrPort {
	if IsTCP(a) {
		return a
	}
	return netip.AddrPortFrom(netip.AddrFrom16(a.Addr().As16()).WithZone(TCPZone), a.Port())
}

// IsTCP reports whether a names a TCP client (TCPAddr).
func IsTCP(a netip.AddrPort) bool {
	ip := a.Addr()
	return ip.Is6() && ip.Zone() == TCPZone
}

// SplitTCP returns the plain address of a, IPv4 unmapped, and whether a
// names a TCP client: what the hop header and the client's packets carry
// (a STUN XOR-MAPPED-ADDRESS, a log line).
func SplitTCP(a netip.AddrPort) (plain netip.AddrPort, tcp bool) {
	tcp = IsTCP(a)
	return netip.AddrPortFrom(a.Addr().WithZone("").Unmap(), a.Port()), tcp
}

// TypeFor returns the hop type that carries packets of client a:
// TypeDataTCP for a TCP client, TypeData otherwise.
func TypeFor(a netip.AddrPort) Type {
	if IsTCP(a) {
		return TypeDataTCP
	}
	return TypeData
}

// ClientOf returns the client a hop header of type t names at address a
// (as ParseHeader returns them): TCPAddr(a) for TypeDataTCP, a otherwise.
func ClientOf(t Type, a netip.AddrPort) netip.AddrPort {
	if t == TypeDataTCP {
		return TCPAddr(a)
	}
	return a
}

// Transport returns "tcp" for a TCP client's address, "udp" otherwise: the
// label of the metrics split by transport.
func Transport(a netip.AddrPort) string {
	if IsTCP(a) {
		return "tcp"
	}
	return "udp"
}
