package relay

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
)

var (
	globalA = netip.MustParseAddrPort("192.0.2.10:3479") // a trusted Global Relay
	rogue   = netip.MustParseAddrPort("203.0.113.66:3479")
)

// TestClusterRelayFromIngress: a cluster relay accepts hop-framed client
// datagrams from trusted Global Relays only, keys the flow by the client
// named in the header, and sends the transceiver's replies back through
// the Global Relay, header and all.
func TestClusterRelayFromIngress(t *testing.T) {
	f := newFixture(t, Config{TrustedIngress: []string{"192.0.2.0/24"}})
	framed := func(client netip.AddrPort, p []byte) []byte {
		return append(hop.AppendHeader(nil, hop.TypeData, client), p...)
	}
	rtp := []byte{0x80, 111, 0, 1, 0, 0, 0, 1}

	tests := []struct {
		name string
		from netip.AddrPort
		pkt  []byte
		to   netip.AddrPort
		drop DropReason
	}{
		{"untrusted source", rogue, framed(c1, f.good(7)), netip.AddrPort{}, DropIngressUntrusted},
		{"bad header", globalA, []byte{hop.Magic, 0x11, 9, 0, 0, 1, 1, 2, 3, 4}, netip.AddrPort{}, DropIngressBadHeader},
		{"empty inner datagram", globalA, framed(c1, nil), netip.AddrPort{}, DropIngressBadHeader},
		{"inner RTP without a flow", globalA, framed(c1, rtp), netip.AddrPort{}, DropNotSTUNOnMiss},
		{"inner Binding request with a token", globalA, framed(c1, f.good(7)), t7, dropNone},
		{"inner RTP on the flow", globalA, framed(c1, rtp), t7, dropNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			to, out, drop := f.pub(tt.from, tt.pkt)
			if drop != tt.drop || to != tt.to {
				t.Fatalf("got %v to %v, want %v to %v", drop, to, tt.drop, tt.to)
			}
			if drop != dropNone {
				return
			}
			// The transceiver gets the datagram as the Global Relay framed it.
			if !bytes.Equal(out, tt.pkt) {
				t.Fatalf("forwarded %x, want %x", out, tt.pkt)
			}
		})
	}

	// The reply goes to the Global Relay, unchanged (header naming c1).
	reply := framed(c1, []byte{0x16, 0xfe, 0xfd})
	to, out, drop := f.r.handleInternal(t7, reply, f.now)
	if drop != dropNone || to != globalA || !bytes.Equal(out, reply) {
		t.Fatalf("reply: %v to %v (%x), want forward to %v", drop, to, out, globalA)
	}
	// Without a TrustedIngress the magic byte is just an unknown first byte.
	plain := newFixture(t, Config{})
	if _, _, drop := plain.pub(globalA, framed(c1, f.good(7))); drop != DropUnknownFirstByte {
		t.Fatalf("hop-framed datagram at a relay with no trusted ingress: %v", drop)
	}
}

// TestGlobalRelayRoutesByCluster: in ingress mode the table maps cluster
// ids to cluster relays, and any cluster's token routes.
func TestGlobalRelayRoutesByCluster(t *testing.T) {
	keys := testKeyring(t, 1, 0xAA)
	relay1, relay2 := netip.MustParseAddrPort("198.18.0.1:3478"), netip.MustParseAddrPort("198.18.0.2:3478")
	tab, _ := membership.NewTable(map[uint32]netip.AddrPort{1: relay1, 2: relay2})
	r, err := newRelay(Config{PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Ingress: true, Workers: 1}, keys, tab, nil, defaultTuning)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{r: r, keys: keys, members: tab}
	tests := []struct {
		cluster uint16
		to      netip.AddrPort
		drop    DropReason
	}{
		{1, relay1, dropNone},
		{2, relay2, dropNone},
		{3, netip.AddrPort{}, DropUnknownCluster},
	}
	for i, tt := range tests {
		client := netip.AddrPortFrom(c1.Addr(), uint16(40000+i))
		pkt := binding(t, mint(t, keys, tt.cluster, 99, f.now)+":cli")
		to, out, drop := f.pub(client, pkt)
		if drop != tt.drop || to != tt.to {
			t.Fatalf("cluster %d: %v to %v, want %v to %v", tt.cluster, drop, to, tt.drop, tt.to)
		}
		if drop == dropNone {
			_, named, payload, err := hop.ParseHeader(out)
			if err != nil || named != client || !bytes.Equal(payload, pkt) {
				t.Fatalf("cluster %d: forwarded header names %v (%v)", tt.cluster, named, err)
			}
			// The cluster relay's reply reaches the client directly.
			back := append(hop.AppendHeader(nil, hop.TypeData, client), 0x16)
			to, out, drop := r.handleInternal(tt.to, back, f.now)
			if drop != dropNone || to != client || !bytes.Equal(out, []byte{0x16}) {
				t.Fatalf("cluster %d reply: %v to %v", tt.cluster, drop, to)
			}
		}
	}
}

// TestViaFollowsTheClient: when a client's consent checks start arriving
// through another Global Relay (the first one died, or anycast moved), the
// flow's replies follow them there.
func TestViaFollowsTheClient(t *testing.T) {
	f := newFixture(t, Config{TrustedIngress: []string{"192.0.2.0/24"}})
	globalB := netip.MustParseAddrPort("192.0.2.20:3479")
	framed := func(p []byte) []byte { return append(hop.AppendHeader(nil, hop.TypeData, c1), p...) }
	check := f.good(7)
	if _, _, drop := f.pub(globalA, framed(check)); drop != dropNone {
		t.Fatal(drop)
	}
	reply := framed([]byte{0x16})
	if to, _, _ := f.r.handleInternal(t7, bytes.Clone(reply), f.now); to != globalA {
		t.Fatalf("reply to %v, want %v", to, globalA)
	}
	// The same consent check (same ufrag) now arrives through B.
	if _, _, drop := f.pub(globalB, framed(check)); drop != dropNone {
		t.Fatal(drop)
	}
	if to, _, _ := f.r.handleInternal(t7, bytes.Clone(reply), f.now); to != globalB {
		t.Fatalf("reply to %v after the path moved, want %v", to, globalB)
	}
	// Media alone through A does not move it back (only a check does).
	if _, _, drop := f.pub(globalA, framed([]byte{0x80, 111, 0, 1})); drop != dropNone {
		t.Fatal(drop)
	}
	if to, _, _ := f.r.handleInternal(t7, bytes.Clone(reply), f.now); to != globalB {
		t.Fatalf("media moved the via to %v", to)
	}
}
