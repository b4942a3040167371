package hop

import (
	"bytes"
	"net/netip"
	"testing"
	"time"
)

func TestTCPAddr(t *testing.T) {
	tests := []struct {
		name  string
		plain netip.AddrPort
	}{
		{"ipv4", netip.MustParseAddrPort("198.51.100.7:50000")},
		{"ipv6", netip.MustParseAddrPort("[2001:db8::7]:443")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := TCPAddr(tt.plain)
			if !IsTCP(a) || IsTCP(tt.plain) {
				t.Fatalf("IsTCP(%v) %v, IsTCP(%v) %v", a, IsTCP(a), tt.plain, IsTCP(tt.plain))
			}
			if a == tt.plain || TCPAddr(a) != a {
				t.Fatalf("TCPAddr(%v) = %v: want a distinct, stable form", tt.plain, a)
			}
			if p, tcp := SplitTCP(a); p != tt.plain || !tcp {
				t.Fatalf("SplitTCP(%v) = %v %v", a, p, tcp)
			}
			if p, tcp := SplitTCP(tt.plain); p != tt.plain || tcp {
				t.Fatalf("SplitTCP(%v) = %v %v", tt.plain, p, tcp)
			}
			if TypeFor(a) != TypeDataTCP || TypeFor(tt.plain) != TypeData || Transport(a) != "tcp" || Transport(tt.plain) != "udp" {
				t.Fatal("TypeFor or Transport")
			}
			// The header names the plain address; the type names the transport.
			b := AppendHeader(nil, TypeFor(a), a)
			typ, c, _, err := ParseHeader(b)
			if err != nil || typ != TypeDataTCP || c != tt.plain || ClientOf(typ, c) != a {
				t.Fatalf("header of %v parses to %v %v %v", a, typ, c, err)
			}
		})
	}
	// A map keyed by address keys by transport too.
	m := map[netip.AddrPort]int{}
	u := netip.MustParseAddrPort("192.0.2.1:9")
	m[u], m[TCPAddr(u)] = 1, 2
	if len(m) != 2 || m[TCPAddr(netip.MustParseAddrPort("192.0.2.1:9"))] != 2 {
		t.Fatalf("map %v", m)
	}
}

// TestConnTCPClient: a TCP client's packet (TypeDataTCP) is read under the
// client's TCP form of address, apart from a UDP client of the same
// ip:port, and a write to each form goes back with its own type.
func TestConnTCPClient(t *testing.T) {
	sock := listen(t)
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	to := c.SocketAddr()
	client := netip.MustParseAddrPort("198.51.100.9:40000")
	for _, typ := range []Type{TypeDataTCP, TypeData} {
		if _, err := relay.WriteToUDPAddrPort(append(AppendHeader(nil, typ, client), 0x16, byte(typ)), to); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	for _, want := range []netip.AddrPort{TCPAddr(client), client} {
		n, from, err := c.ReadFromAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		if from != want || n != 2 {
			t.Fatalf("read %x from %v, want from %v", buf[:n], from, want)
		}
	}
	for _, a := range []netip.AddrPort{TCPAddr(client), client} {
		if _, err := c.WriteToAddrPort([]byte{0x17, 1}, a); err != nil {
			t.Fatal(err)
		}
		_ = relay.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := relay.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		typ, got, p, err := ParseHeader(buf[:n])
		if err != nil || typ != TypeFor(a) || got != client || !bytes.Equal(p, []byte{0x17, 1}) {
			t.Fatalf("write to %v sent %v %v %x %v", a, typ, got, p, err)
		}
	}
	if s := c.Stats(); s.Received != 2 || s.ReceivedTCP != 1 || s.Sent != 2 || s.SentTCP != 1 || s.Routes != 2 {
		t.Fatalf("stats %+v", s)
	}
}
