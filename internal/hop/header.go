// Package hop implements Switchboard's internal hop: the framing that every
// datagram carries between a relay and a transceiver (and between a Global
// Relay and a cluster relay), and the transceiver's end of it, a
// net.PacketConn that the transceiver's WebRTC endpoint reads as if clients
// were directly attached.
//
// Every internal-hop datagram starts with a header naming the public client
// address the payload came from or must go to (docs/hop.md):
//
//	byte 0     magic 0xF5 (outside every RFC 7983 demux range, so a hop
//	           datagram can never be mistaken for STUN, DTLS, RTP or RTCP)
//	byte 1     version (high nibble, 1) | type (low nibble): 1 DATA, a
//	           UDP client's datagram; 2 DATA_TCP, one RFC 4571 frame of an
//	           ICE-TCP client's connection (RFC 6544), length removed
//	byte 2     address family: 4 or 6
//	byte 3     reserved, sent as 0 and ignored
//	bytes 4-5  client UDP port, big endian
//	bytes 6-   client IP address, 4 or 16 bytes
//
// so the header is 10 bytes for IPv4 clients and 22 for IPv6 clients. The
// payload that follows is the client's datagram (or TCP frame), byte for
// byte. A client is named by transport and address: a UDP and a TCP client
// with the same ip:port are two clients (transport.go).
package hop

import (
	"errors"
	"net/netip"
)

const (
	// Magic is the first byte of every internal-hop datagram.
	Magic = 0xF5
	// Version is the header version this package writes and accepts.
	Version = 1
	// HeaderLenV4 is the header length for an IPv4 client, in bytes.
	HeaderLenV4 = 10
	// HeaderLenV6 is the header length for an IPv6 client, in bytes.
	HeaderLenV6 = 22
	// MaxHeaderLen is the longest header. Readers that leave this much room
	// in front of a payload can prepend a header without copying it.
	MaxHeaderLen = HeaderLenV6
)

// Type says what an internal-hop datagram carries.
type Type uint8

const (
	// TypeData carries one datagram (STUN, DTLS, RTP or RTCP) of a client
	// on UDP, in either direction.
	TypeData Type = 1
	// TypeDataTCP carries one packet (STUN, DTLS, RTP or RTCP) of a client
	// on ICE-TCP (RFC 6544): the payload of one RFC 4571 frame of the
	// client's TCP connection to a relay, without its 2-byte length, in
	// either direction. The address is the client's TCP address. A relay
	// or transceiver older than this type drops it (ErrType), never
	// mistakes it for a UDP client's.
	TypeDataTCP Type = 2
)

// Errors returned by ParseHeader, unwrapped so callers can count them
// without allocating.
var (
	ErrShort   = errors.New("hop: datagram shorter than its header")
	ErrMagic   = errors.New("hop: bad magic")
	ErrVersion = errors.New("hop: unsupported version")
	ErrType    = errors.New("hop: unknown type")
	ErrFamily  = errors.New("hop: unknown address family")
	ErrAddress = errors.New("hop: invalid client address")
)

// HeaderLen returns the header length for a client at addr: HeaderLenV4 for
// an IPv4 (or IPv4-mapped IPv6) address, HeaderLenV6 otherwise.
func HeaderLen(addr netip.Addr) int {
	if addr.Unmap().Is4() {
		return HeaderLenV4
	}
	return HeaderLenV6
}

// PutHeader writes the header for client into the start of b and returns
// its length. IPv4-mapped IPv6 addresses are written as IPv4. b must be at
// least HeaderLen(client.Addr()) long; PutHeader panics otherwise, as that
// is a programming error, never a network input.
func PutHeader(b []byte, t Type, client netip.AddrPort) int {
	addr := client.Addr().Unmap()
	b[0] = Magic
	b[1] = Version<<4 | byte(t)&0x0f
	b[3] = 0
	b[4] = byte(client.Port() >> 8)
	b[5] = byte(client.Port())
	if addr.Is4() {
		b[2] = 4
		a := addr.As4()
		copy(b[6:10], a[:])
		return HeaderLenV4
	}
	b[2] = 6
	a := addr.As16()
	copy(b[6:22], a[:])
	return HeaderLenV6
}

// AppendHeader appends the header for client to dst.
func AppendHeader(dst []byte, t Type, client netip.AddrPort) []byte {
	var h [MaxHeaderLen]byte
	n := PutHeader(h[:], t, client)
	return append(dst, h[:n]...)
}

// ParseHeader reads the header at the start of b. payload aliases b. The
// client address is never zero or unspecified and has a non-zero port; an
// IPv4-mapped address in an IPv6 header is rejected (ErrAddress), since
// PutHeader writes IPv4 clients as family 4. It never reads past len(b), never
// allocates, and returns one of the package's errors on bad input.
func ParseHeader(b []byte) (t Type, client netip.AddrPort, payload []byte, err error) {
	if len(b) < HeaderLenV4 {
		return 0, netip.AddrPort{}, nil, ErrShort
	}
	if b[0] != Magic {
		return 0, netip.AddrPort{}, nil, ErrMagic
	}
	if b[1]>>4 != Version {
		return 0, netip.AddrPort{}, nil, ErrVersion
	}
	t = Type(b[1] & 0x0f)
	if t != TypeData && t != TypeDataTCP {
		return 0, netip.AddrPort{}, nil, ErrType
	}
	port := uint16(b[4])<<8 | uint16(b[5])
	var addr netip.Addr
	var n int
	switch b[2] {
	case 4:
		addr, n = netip.AddrFrom4([4]byte(b[6:10])), HeaderLenV4
	case 6:
		if len(b) < HeaderLenV6 {
			return 0, netip.AddrPort{}, nil, ErrShort
		}
		addr, n = netip.AddrFrom16([16]byte(b[6:22])), HeaderLenV6
		if addr.Is4In6() {
			// Canonical form: IPv4 clients travel as family 4, so that
			// one client has one encoding.
			return 0, netip.AddrPort{}, nil, ErrAddress
		}
	default:
		return 0, netip.AddrPort{}, nil, ErrFamily
	}
	if port == 0 || addr.IsUnspecified() {
		return 0, netip.AddrPort{}, nil, ErrAddress
	}
	return t, netip.AddrPortFrom(addr, port), b[n:], nil
}
