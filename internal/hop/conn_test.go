package hop

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func listen(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConnDeliversThroughRelayOnly(t *testing.T) {
	sock := listen(t)
	vip := netip.MustParseAddrPort("127.0.0.1:3478")
	c, err := NewConn(sock, ConnConfig{Advertise: vip, AllowRelays: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.LocalAddr().String(); got != vip.String() {
		t.Fatalf("LocalAddr %s, want the advertised %s", got, vip)
	}
	relay := listen(t)
	defer relay.Close()
	direct := listen(t)
	defer direct.Close()
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	client := netip.MustParseAddrPort("198.51.100.9:40000")

	// A datagram straight from a "client" (no header) is dropped; the one
	// through the relay is delivered with the client's address.
	if _, err := direct.WriteTo([]byte{0x80, 1, 2, 3}, to); err != nil {
		t.Fatal(err)
	}
	payload := []byte{0x16, 0xfe, 0xfd, 9, 9}
	if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, client), payload...), to); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := c.ReadFromAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if from != client || !bytes.Equal(buf[:n], payload) {
		t.Fatalf("read %x from %s, want %x from %s", buf[:n], from, payload, client)
	}
	if s := c.Stats(); s.DroppedNotHop != 1 || s.Received != 1 || s.Routes != 1 {
		t.Fatalf("stats %+v", s)
	}

	// The reply goes to the relay that delivered, with the client's header.
	if _, err := c.WriteTo([]byte("reply"), net.UDPAddrFromAddrPort(client)); err != nil {
		t.Fatal(err)
	}
	_ = relay.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err = relay.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	_, got, p, err := ParseHeader(buf[:n])
	if err != nil || got != client || string(p) != "reply" {
		t.Fatalf("relay got %v %q %v", got, p, err)
	}

	// No route: a client never seen.
	if _, err := c.WriteToAddrPort([]byte("x"), netip.MustParseAddrPort("192.0.2.1:1")); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("got %v, want ErrNoRoute", err)
	}
}

func TestConnDropsUntrustedRelay(t *testing.T) {
	sock := listen(t)
	c, err := NewConn(sock, ConnConfig{
		Advertise:   netip.MustParseAddrPort("127.0.0.1:3478"),
		AllowRelays: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	pkt := AppendHeader(nil, TypeData, netip.MustParseAddrPort("198.51.100.9:40000"))
	if _, err := relay.WriteTo(pkt, net.UDPAddrFromAddrPort(c.SocketAddr())); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, _, err := c.ReadFromAddrPort(make([]byte, 1500)); err == nil {
		t.Fatal("read a datagram from an untrusted relay")
	}
	if s := c.Stats(); s.DroppedUntrusted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNewConnRejectsBadAdvertise(t *testing.T) {
	sock := listen(t)
	defer sock.Close()
	if _, err := NewConn(sock, ConnConfig{}); err == nil {
		t.Fatal("want an error for a missing advertise address")
	}
}

// TestConnSizeLimit: a client payload longer than MaxPayload is dropped and
// counted on the way in (never handed to Pion, whose read buffers are
// MaxPayload long) and refused on the way out; one of exactly MaxPayload
// bytes passes both ways.
func TestConnSizeLimit(t *testing.T) {
	sock := listen(t)
	c, err := NewConn(sock, ConnConfig{Advertise: netip.MustParseAddrPort("127.0.0.1:3478")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	relay := listen(t)
	defer relay.Close()
	to := net.UDPAddrFromAddrPort(c.SocketAddr())
	client := netip.MustParseAddrPort("198.51.100.9:40000")
	big := bytes.Repeat([]byte{0x80}, MaxPayload+1)
	for _, p := range [][]byte{big, big[:MaxPayload]} {
		if _, err := relay.WriteTo(append(AppendHeader(nil, TypeData, client), p...), to); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 8192) // Pion's UDP mux reads with 8 KiB
	n, _, err := c.ReadFromAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != MaxPayload {
		t.Fatalf("read %d bytes, want the %d-byte datagram (the %d-byte one dropped)", n, MaxPayload, MaxPayload+1)
	}
	if s := c.Stats(); s.DroppedTooBig != 1 || s.Received != 1 {
		t.Fatalf("stats %+v, want 1 too big and 1 received", s)
	}
	if _, err := c.WriteToAddrPort(big, client); !errors.Is(err, ErrTooBig) {
		t.Fatalf("writing %d bytes: %v, want %v", len(big), err, ErrTooBig)
	}
	if _, err := c.WriteToAddrPort(big[:MaxPayload], client); err != nil {
		t.Fatalf("writing %d bytes: %v", MaxPayload, err)
	}
	if s := c.Stats(); s.DroppedTooBig != 2 || s.Sent != 1 {
		t.Fatalf("stats %+v, want 2 too big and 1 sent", s)
	}
}
